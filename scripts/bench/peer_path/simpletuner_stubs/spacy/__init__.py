"""Import-only stand-in for spaCy in SimpleTuner's benchmark process (README.md beside it): only its ACE-Step
lyric tokenizer uses it, imported when its field registry loads every model family; any use raises."""
