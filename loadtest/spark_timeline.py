"""Where a streaming query's micro-batches spend their wall time inside Spark's jobs, from the
session's event log (``spark.eventLog.enabled``, uncompressed, ``conf(folder)``): one line a
micro-batch's job, its stages in order, each with its wall time and its tasks' run and CPU
times (``bench_spark_stream.py --timeline``). A scan stage whose tasks run much longer than
they use CPU waits (for its source's reads, a Python worker); Spark's progress reports only
``addBatch`` as a whole.

    spark_stream_timeline query=tidemq_averages_2 job=2 job_ms=287 stages=201:2x[191/51,170/54]+81:2x[66/14,67/13]

(``stages``: each stage's wall ms, then its tasks' ``run ms/CPU ms``.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


def conf(folder: Path) -> dict[str, str]:
    """Spark settings that write the session's event log into ``folder`` as plain JSON lines."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": folder.as_uri(),
            "spark.eventLog.compress": "false"}


@dataclass(slots=True)
class Stage:
    wall_ms: int = 0
    tasks: list[tuple[int, int]] = field(default_factory=list)  # (run ms, CPU ms), in launch order


@dataclass(slots=True)
class Job:
    query: str
    wall_ms: int = 0
    stages: dict[int, Stage] = field(default_factory=dict)  # by stage id: run order


def jobs(folder: Path) -> list[Job]:
    """The jobs of every event log in ``folder`` that belong to a streaming query (the query's
    name is the first line of the job's description), in the order they started."""
    events = [json.loads(line) for path in sorted(folder.rglob("events_*")) for line in path.open()]
    found: dict[int, Job] = {}
    stage_job: dict[int, Job] = {}
    launched: dict[int, list[tuple[int, int, int]]] = {}
    for event in events:
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            query = event.get("Properties", {}).get("spark.job.description", "").split("\n")[0]
            if query:
                job = found[event["Job ID"]] = Job(query, -event["Submission Time"])
                for stage in event["Stage IDs"]:
                    stage_job[stage] = job
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in found:
            found[event["Job ID"]].wall_ms += event["Completion Time"]
        elif kind == "SparkListenerStageCompleted" and event["Stage Info"]["Stage ID"] in stage_job:
            info = event["Stage Info"]
            stage_job[info["Stage ID"]].stages[info["Stage ID"]] = Stage(info["Completion Time"] - info["Submission Time"])
        elif kind == "SparkListenerTaskEnd" and event["Stage ID"] in stage_job:
            metrics = event.get("Task Metrics") or {}
            launched.setdefault(event["Stage ID"], []).append(
                (event["Task Info"]["Launch Time"], metrics.get("Executor Run Time", 0),
                 metrics.get("Executor CPU Time", 0) // 1_000_000))
    for stage_id, tasks in launched.items():
        stage = stage_job[stage_id].stages.get(stage_id)
        if stage is not None:
            stage.tasks = [(run, cpu) for _, run, cpu in sorted(tasks)]
    return [found[k] for k in sorted(found) if found[k].wall_ms >= 0]


def lines(folder: Path) -> list[str]:
    """One ``spark_stream_timeline`` line a micro-batch's job (the module's docstring), numbered
    by query (a query's micro-batch without rows runs a job too)."""
    out = []
    number: dict[str, int] = {}
    for job in jobs(folder):
        number[job.query] = number.get(job.query, 0) + 1
        stages = "+".join(f"{s.wall_ms}:{len(s.tasks)}x[{','.join(f'{r}/{c}' for r, c in s.tasks)}]"
                          for _, s in sorted(job.stages.items()))
        out.append(f"spark_stream_timeline query={job.query} job={number[job.query]} job_ms={job.wall_ms} "
                   f"stages={stages}")
    return out
