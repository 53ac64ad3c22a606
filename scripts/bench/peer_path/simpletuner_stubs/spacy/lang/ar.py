"""spacy.lang.ar's class as SimpleTuner imports it; never built on the benchmark's path."""

from spacy.lang import StandInLanguage


class Arabic(StandInLanguage):
    pass
