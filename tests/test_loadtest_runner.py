"""loadtest/runner.py, the benchmarks' one runner: the command line and the result lines."""

from __future__ import annotations

from pathlib import Path

from loadtest import runner

DOC = """What this benchmark measures, in one paragraph.

    python -m loadtest.bench_x [--quick]
"""


def test_lines_are_printed_and_appended_to_out(tmp_path: Path, capsys) -> None:
    out = tmp_path / "lines.txt"
    out.write_text("earlier\n")
    with runner.Lines(str(out)) as lines:
        lines.emit("# header")
        lines.emit("case=a rate=1")
    assert capsys.readouterr().out == "# header\ncase=a rate=1\n"
    assert out.read_text() == "earlier\n# header\ncase=a rate=1\n"


def test_lines_without_out_are_only_printed(capsys) -> None:
    with runner.Lines(None) as lines:
        lines.emit("case=a")
    assert capsys.readouterr().out == "case=a\n"


def test_the_parser_takes_quick_and_out_when_asked() -> None:
    parser = runner.parser(DOC, quick="a short run")
    assert parser.description == "What this benchmark measures, in one paragraph."
    args = parser.parse_args(["--quick", "--out", "f.txt"])
    assert args.quick and args.out == "f.txt"
    bare = runner.parser(DOC, out=False)
    assert not hasattr(bare.parse_args([]), "quick") and not hasattr(bare.parse_args([]), "out")
    assert runner.parser(DOC, out=False, whole_doc=True).description == DOC
