"""Import-only stand-in for wandb in SimpleTuner's benchmark process (README.md beside it): its code never
runs there (`report_to` is "none"); any use raises."""


def __getattr__(name: str):
    raise RuntimeError(f"wandb.{name}: the benchmark's wandb stand-in was used (report_to must be 'none')")
