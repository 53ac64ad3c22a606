"""spacy.lang.zh's class as SimpleTuner imports it; never built on the benchmark's path."""

from spacy.lang import StandInLanguage


class Chinese(StandInLanguage):
    pass
