"""Prompt formatting and tokenization, as the released MOSS-Image pipeline does them.

`CHAT_TEMPLATE` (the default) is the tokenizer's own chat template over one user turn:
`apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True,
enable_thinking=True)`; for Qwen3.5 that ends in `<|im_start|>assistant\\n<think>\\n`. A literal template
with one `{caption}` placeholder is the alternative (no str.format escaping). Either way the whole
formatted text is tokenized in one call, truncated at `max_length` tokens, and every token is kept:
the encoder returns the template's tokens with the caption's. An empty prompt is the template alone.
"""

from __future__ import annotations

from kohakumoss_common.errors import ConfigError

CHAT_TEMPLATE = "chat"  # the tokenizer's chat template, generation prompt, thinking on
PLACEHOLDER = "{caption}"
MAX_TEXT_TOKENS = 4096  # the released cap on the templated prompt's tokens


def check_template(template: str) -> None:
    if template != CHAT_TEMPLATE and template.count(PLACEHOLDER) != 1:
        raise ConfigError(
            "text_encoder.template", f"must be {CHAT_TEMPLATE!r} or contain {PLACEHOLDER!r} exactly once"
        )


def fallback_token(tokenizer) -> int:
    """The token an empty prompt with an empty template is encoded as (end of text, else padding)."""
    for tid in (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id):
        if tid is not None:
            return int(tid)
    raise ConfigError(
        "text_encoder.tokenizer_path", "tokenizer has no eos, pad or unk token for empty prompts"
    )


class PromptTokenizer:
    """Captions -> token ids of the whole templated prompt (at least one token, at most max_length)."""

    def __init__(self, tokenizer, template: str, max_length: int = MAX_TEXT_TOKENS):
        check_template(template)
        if template == CHAT_TEMPLATE and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "text_encoder.template",
                f"the tokenizer has no chat template; give a literal template with {PLACEHOLDER}",
            )
        if max_length < 1:
            raise ConfigError("text_encoder.max_length", f"must be >= 1, got {max_length}")
        self.tokenizer = tokenizer
        self.template = template
        self.max_length = max_length
        self.fallback = fallback_token(tokenizer)

    def format(self, caption: str) -> str:
        if self.template != CHAT_TEMPLATE:
            return self.template.replace(PLACEHOLDER, caption)
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": caption}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=True,
        )

    def __call__(self, caption: str) -> list[int]:
        text = self.format(caption)
        ids = self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"] if text else []
        return list(ids) or [self.fallback]
