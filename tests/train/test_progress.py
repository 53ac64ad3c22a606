"""Progress lines in the log where no terminal shows the bar."""

from __future__ import annotations

from kohakumoss.train.logbook import ProgressLines


def test_progress_lines_at_the_first_step_every_interval_and_the_last():
    lines, now = [], [0.0]

    class Log:
        def info(self, text):
            lines.append(text)

    progress = ProgressLines(Log(), total=5, every_s=10.0, clock=lambda: now[0])
    for step, t in zip(range(1, 6), (0.0, 4.0, 11.0, 15.0, 16.0)):
        now[0] = t
        progress.update(step, 0.5, 1000.0)
    assert [line.split()[1] for line in lines] == ["1/5", "3/5", "5/5"]
    assert "1,000 tokens/s" in lines[0] and "16 s elapsed" in lines[-1]
