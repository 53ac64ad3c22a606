"""The language classes SimpleTuner's ace_step/lyrics_utils/lyric_tokenizer.py imports (never built here)."""


class StandInLanguage:
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError(f"spacy {type(self).__name__}: the benchmark's spaCy stand-in was used")
