"""Prompt template and tokenization: template tokens around the caption, and the span that is kept.

The prefix, the caption and the suffix are tokenized separately and joined, so the caption's token
span is exact (no offset guessing). A caption with no tokens keeps one template token (the first of
the suffix, else the last of the prefix), or, without a template, the tokenizer's end/pad token:
every sample yields at least one text token.
"""

from __future__ import annotations

from dataclasses import dataclass

from kohakumoss_common.errors import ConfigError

PLACEHOLDER = "{caption}"


@dataclass(frozen=True)
class Tokenized:
    """Token ids of one prompt and the [start, end) span of them that the encoder returns."""

    ids: list[int]
    start: int
    end: int


def split_template(template: str) -> tuple[str, str]:
    if template.count(PLACEHOLDER) != 1:
        raise ConfigError("text_encoder.template", f"must contain {PLACEHOLDER!r} exactly once")
    prefix, suffix = template.split(PLACEHOLDER)
    return prefix, suffix


def fallback_token(tokenizer) -> int:
    """The token an empty prompt with an empty template is encoded as (end of text, else padding)."""
    for tid in (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id):
        if tid is not None:
            return int(tid)
    raise ConfigError(
        "text_encoder.tokenizer_path", "tokenizer has no eos, pad or unk token for empty prompts"
    )


class PromptTokenizer:
    """Turns captions into `Tokenized` prompts with a fixed template."""

    def __init__(self, tokenizer, template: str, max_length: int, keep_template_tokens: bool):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.keep_template_tokens = keep_template_tokens
        prefix, suffix = split_template(template)
        self.prefix = self._ids(prefix)
        self.suffix = self._ids(suffix)
        self.fallback = fallback_token(tokenizer)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def __call__(self, caption: str) -> Tokenized:
        caption_ids = self._ids(caption)[: self.max_length]
        ids = self.prefix + caption_ids + self.suffix
        if not ids:
            return Tokenized([self.fallback], 0, 1)
        if self.keep_template_tokens:
            return Tokenized(ids, 0, len(ids))
        start, end = len(self.prefix), len(self.prefix) + len(caption_ids)
        if start == end:
            start, end = (start, start + 1) if self.suffix else (start - 1, start)
        return Tokenized(ids, start, end)
