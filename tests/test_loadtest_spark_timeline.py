"""``loadtest.spark_timeline`` reads a Spark event log (JSON lines, as Spark 4.3 writes them) into
one line per streaming micro-batch's job: its stages in run order, each with its tasks' run and
CPU times in launch order; jobs outside a query (no description) and unfinished ones are left out."""

import json
from pathlib import Path

from loadtest import spark_timeline


def job(job_id: int, stages: list[int], at: int, description: str | None) -> dict:
    props = {"spark.job.description": description} if description is not None else {}
    return {"Event": "SparkListenerJobStart", "Job ID": job_id, "Submission Time": at, "Stage IDs": stages,
            "Properties": props}


def stage_done(stage_id: int, start: int, end: int) -> dict:
    return {"Event": "SparkListenerStageCompleted",
            "Stage Info": {"Stage ID": stage_id, "Submission Time": start, "Completion Time": end}}


def task(stage_id: int, launch: int, run_ms: int, cpu_ms: int) -> dict:
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage_id, "Task Info": {"Launch Time": launch},
            "Task Metrics": {"Executor Run Time": run_ms, "Executor CPU Time": cpu_ms * 1_000_000}}


def test_a_line_per_micro_batch_job(tmp_path: Path) -> None:
    events = [
        {"Event": "SparkListenerApplicationStart"},
        job(0, [0], 1000, None),  # (a job of no query: not a micro-batch)
        stage_done(0, 1000, 1010),
        {"Event": "SparkListenerJobEnd", "Job ID": 0, "Completion Time": 1010},
        job(1, [1, 2], 2000, "tidemq_averages_2\nid = 3b53601c\nrunId = 9"),
        task(1, 2005, 190, 51), task(1, 2003, 170, 54),  # ended in another order than launched
        stage_done(1, 2002, 2203),
        task(2, 2210, 66, 14), task(2, 2211, 67, 13),
        stage_done(2, 2206, 2287),
        {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": 2287},
        job(2, [3], 3000, "tidemq_averages_2\nid = 3b53601c\nrunId = 9"),
        stage_done(3, 3001, 3090),
        {"Event": "SparkListenerJobEnd", "Job ID": 2, "Completion Time": 3090},
        job(3, [4], 4000, "tidemq_averages_2\nid = 3b53601c\nrunId = 9"),  # (never ended: the session stopped)
    ]
    folder = tmp_path / "eventlog_v2_local-1"
    folder.mkdir()
    (folder / "events_1_local-1").write_text("".join(json.dumps(e) + "\n" for e in events))

    assert spark_timeline.lines(tmp_path) == [
        "spark_stream_timeline query=tidemq_averages_2 job=1 job_ms=287 stages=201:2x[170/54,190/51]+81:2x[66/14,67/13]",
        "spark_stream_timeline query=tidemq_averages_2 job=2 job_ms=90 stages=89:0x[]",
    ]


def test_conf_writes_plain_json_into_the_folder(tmp_path: Path) -> None:
    conf = spark_timeline.conf(tmp_path / "events")
    assert (tmp_path / "events").is_dir()
    assert conf == {"spark.eventLog.enabled": "true", "spark.eventLog.dir": (tmp_path / "events").as_uri(),
                    "spark.eventLog.compress": "false"}
