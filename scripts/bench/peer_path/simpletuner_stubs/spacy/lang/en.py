"""spacy.lang.en's class as SimpleTuner imports it; never built on the benchmark's path."""

from spacy.lang import StandInLanguage


class English(StandInLanguage):
    pass
