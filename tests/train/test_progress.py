"""Progress wherever a user waits: training lines (in log.txt beside a bar too, with percentage and ETA),
bars or lines for other waits, nothing when there is nothing to do, third-party chatter held back."""

from __future__ import annotations

import io
import logging

from kohakumoss.train.logbook import ProgressLines
from kohakumoss_common.log import FILE_ONLY, add_file_log, get_logger, quiet_third_party
from kohakumoss_common.progress import Progress, StepProgress, duration, progress_line


class Log:
    def __init__(self):
        self.lines, self.extras = [], []

    def info(self, text, extra=None):
        self.lines.append(text)
        self.extras.append(extra)


def test_progress_lines_at_the_first_step_every_interval_and_the_last():
    log, now = Log(), [0.0]
    progress = ProgressLines(log, total=5, every_s=10.0, clock=lambda: now[0])
    for step, t in zip(range(1, 6), (0.0, 4.0, 11.0, 15.0, 16.0)):
        now[0] = t
        progress.update(step, 0.5, 1000.0)
    lines = log.lines
    assert [line.split()[1] for line in lines] == ["1/5", "3/5", "5/5"]
    assert "1,000 tokens/s" in lines[0] and "16 s elapsed" in lines[-1]
    assert "(60%)" in lines[1] and "ETA 11 s" in lines[1] and "ETA" not in lines[0]  # 2 steps in 11 s
    assert "ETA" not in lines[-1] and set(log.extras) == {None}


def test_with_a_bar_the_step_lines_go_to_the_log_file_only(tmp_path):
    log = get_logger("kohakumoss.train.test_progress")
    console = next(h for h in logging.getLogger("kohakumoss").handlers if type(h) is logging.StreamHandler)
    shown = io.StringIO()
    before = console.setStream(shown)
    handler = add_file_log(tmp_path / "log.txt")
    try:
        ProgressLines(log, total=3, console=False).update(1, 0.25, 10.0)
        log.info("a plain line")
    finally:
        logging.getLogger("kohakumoss").removeHandler(handler)
        handler.close()
        console.setStream(before)
    text = (tmp_path / "log.txt").read_text()
    assert "step 1/3 (33%)  loss 0.2500" in text and "a plain line" in text
    assert "a plain line" in shown.getvalue() and "step 1/3" not in shown.getvalue()


def test_progress_off_a_terminal_logs_percentage_and_eta_and_nothing_when_empty():
    log, now = Log(), [0.0]
    with Progress(4, "latents", "img", terminal=False, logger=log, every_s=5.0, clock=lambda: now[0]) as bar:
        for t in (1.0, 2.0, 6.0, 8.0):
            now[0] = t
            bar.update(1)
    assert log.lines == [
        "latents: 0/4 img (0%), 0 s elapsed",
        "latents: 3/4 img (75%), 6 s elapsed, ETA 2 s",
        "latents: 4/4 img (100%), 8 s elapsed",
    ]
    empty = Log()
    with Progress(0, "scan", "file", terminal=False, logger=empty) as bar:
        bar.update(0)
    assert empty.lines == []
    assert Progress(0, "scan", terminal=True).bar is None  # no empty bar on a terminal either
    assert duration(59.6) == "1m00s" and duration(3725) == "1h02m"
    assert progress_line("x", 1, 2, "step", 3.0) == "x: 1/2 step (50%), 3 s elapsed, ETA 3 s"


def test_step_progress_opens_one_progress_per_sampling_run():
    log = Log()
    steps = StepProgress("image 1 of 2", terminal=False, logger=log, every_s=1e9)
    for i in range(1, 4):
        steps(i, 3)
    for i in range(1, 3):
        steps(i, 2)
    assert log.lines[0] == "image 1 of 2: 0/3 step (0%), 0 s elapsed" and log.lines[1].startswith(
        "image 1 of 2: 3/3"
    )
    assert log.lines[2].startswith("image 1 of 2 (2): 0/2") and log.lines[3].startswith(
        "image 1 of 2 (2): 2/2"
    )


def test_third_party_loggers_show_warnings_only():
    import lycoris  # noqa: F401  (sets its logger's own level and handler at import)

    quiet_third_party()
    quiet_third_party()  # idempotent: one filter
    chatty = logging.getLogger("LyCORIS")
    assert sum(type(f).__name__ == "_AtLeast" for f in chatty.filters) == 1
    seen: list[str] = []

    class Collect(logging.Handler):  # lycoris's own handler holds whatever stderr was at its import
        def emit(self, record):
            seen.append(record.getMessage())

    pytree = logging.getLogger("torch.utils._pytree")
    for logger in (chatty, pytree):
        logger.addHandler(Collect())
    try:
        chatty.info("24 Modules Loaded")
        chatty.warning("a real warning")
        pytree.warning("register_constant() on Enum subclasses is deprecated")
    finally:
        for logger in (chatty, pytree):
            logger.handlers = [h for h in logger.handlers if not isinstance(h, Collect)]
    assert not logging.getLogger("torchao.quantization").isEnabledFor(logging.INFO)  # children too
    assert "a real warning" in seen
    assert not any("Modules Loaded" in m or "register_constant" in m for m in seen)
    assert FILE_ONLY == {"file_only": True}
