"""metrics.jsonl on resume: the lines past the checkpoint's step are dropped, a line cut short is too."""

from __future__ import annotations

import json

from kohakumoss.train.logbook import MetricsWriter


def test_resume_keeps_the_lines_up_to_its_step_and_drops_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    whole = "".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2, 3, 4))
    path.write_text(whole + '{"step": 5, "lo')  # killed in the middle of step 5's line
    writer = MetricsWriter(path, resume_step=2)
    assert writer.read() == [{"step": 1, "loss": 0.1}, {"step": 2, "loss": 0.2}]
    writer.write({"step": 3, "loss": 0.5})
    assert [r["step"] for r in writer.read()] == [1, 2, 3]
    assert path.read_text().splitlines()[-1] == json.dumps({"step": 3, "loss": 0.5})


def test_a_cut_line_beyond_the_resume_step_is_no_record_in_a_later_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 1.0}) + '\n{"step": 2, "loss"\n')
    assert MetricsWriter(path, resume_step=4).read() == [{"step": 1, "loss": 1.0}]
    assert path.read_text() == json.dumps({"step": 1, "loss": 1.0}) + "\n"
