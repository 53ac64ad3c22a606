"""The memory plan: one frozen value that says where every byte of a training step lives.

Resolved once at build time from the knobs (MEMORY_PROFILE names a profile or a catalog entry; the
per-engine knobs override single fields), then `kohakumoss.memory.install.install_memory_plan`
installs the engines it names. Every field is a knob:

    CHECKPOINTING        none | full | attn | mlp     activation checkpointing per block
    CHECKPOINT_EVERY     k >= 1                       ... on blocks 0, k, 2k, ...
    STREAM_BLOCKS        n >= 0 or -1 (all)           blocks whose weights live in pinned host memory
    STREAM_SLOTS         k >= 2                       GPU slots in the streaming ring
    ACTIVATION_OFFLOAD   none | on                    saved activations to host, prefetched in backward
    GRAD_OFFLOAD         False | True                 grads to host fp32 sums through a staging ring
    OPTIMIZER_PLACEMENT  gpu | stream | host          optimizer states (and fp32 masters) location
    TEXT_ENCODER_PLACEMENT  resident | streamed | off the text encoder (off: its cache filled before training)
    VAE_PLACEMENT        resident | streamed | off    the VAE likewise (off: its cache filled before training)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from kohakumoss_common.errors import ConfigError

CHECKPOINT_MODES = ("none", "full", "attn", "mlp")
ACTIVATION_OFFLOAD_MODES = ("none", "on")
OPTIMIZER_PLACEMENTS = ("gpu", "stream", "host")
ENCODER_PLACEMENTS = ("resident", "streamed", "off")

# knob name -> MemoryPlan field
PLAN_KNOBS = {
    "CHECKPOINTING": "checkpointing",
    "CHECKPOINT_EVERY": "checkpoint_every",
    "STREAM_BLOCKS": "stream_blocks",
    "STREAM_SLOTS": "stream_slots",
    "ACTIVATION_OFFLOAD": "activation_offload",
    "GRAD_OFFLOAD": "grad_offload",
    "OPTIMIZER_PLACEMENT": "optimizer",
    "TEXT_ENCODER_PLACEMENT": "text_encoder",
    "VAE_PLACEMENT": "vae",
}
FIELD_KNOBS = {v: k for k, v in PLAN_KNOBS.items()}
# each engine's field and the value that keeps what it moves on the card
ON_CARD = (
    ("stream_blocks", 0),
    ("activation_offload", "none"),
    ("grad_offload", False),
    ("optimizer", "gpu"),
)
# the block runner calls each block whole (its FSDP2 hooks gather it): half-block checkpointing would not
FSDP_CHECKPOINTING = ("none", "full")


@dataclass(frozen=True)
class MemoryPlan:
    checkpointing: str = "none"
    checkpoint_every: int = 1
    stream_blocks: int = 0  # -1: every block
    stream_slots: int = 2
    activation_offload: str = "none"
    grad_offload: bool = False
    optimizer: str = "gpu"
    text_encoder: str = "resident"
    vae: str = "resident"

    def __post_init__(self) -> None:
        def bad(field: str, msg: str) -> ConfigError:
            return ConfigError(FIELD_KNOBS[field], msg)

        if self.checkpointing not in CHECKPOINT_MODES:
            raise bad("checkpointing", f"'{self.checkpointing}' is not one of {CHECKPOINT_MODES}")
        if int(self.checkpoint_every) < 1:
            raise bad("checkpoint_every", f"must be >= 1, got {self.checkpoint_every}")
        if int(self.stream_blocks) < -1:
            raise bad("stream_blocks", f"must be >= 0 or -1 (all blocks), got {self.stream_blocks}")
        if int(self.stream_slots) < 2:
            raise bad(
                "stream_slots",
                f"the ring needs >= 2 slots (one computing, one loading), got {self.stream_slots}",
            )
        if self.activation_offload not in ACTIVATION_OFFLOAD_MODES:
            raise bad(
                "activation_offload", f"'{self.activation_offload}' is not one of {ACTIVATION_OFFLOAD_MODES}"
            )
        if self.optimizer not in OPTIMIZER_PLACEMENTS:
            raise bad("optimizer", f"'{self.optimizer}' is not one of {OPTIMIZER_PLACEMENTS}")
        if self.grad_offload and self.optimizer == "gpu":
            raise bad(
                "grad_offload",
                "offloaded grads are summed on the host: use OPTIMIZER_PLACEMENT 'stream' or 'host'",
            )
        for name in ("text_encoder", "vae"):
            if getattr(self, name) not in ENCODER_PLACEMENTS:
                raise bad(name, f"'{getattr(self, name)}' is not one of {ENCODER_PLACEMENTS}")

    def streamed_count(self, depth: int) -> int:
        """How many blocks stream (the first ones); the ring never holds more slots than that."""
        return depth if self.stream_blocks < 0 else min(int(self.stream_blocks), depth)

    def slots(self, depth: int) -> int:
        return min(int(self.stream_slots), max(self.streamed_count(depth), 0))

    def refusal(self, full_ft: bool, depth: int) -> tuple[str, str] | None:
        """(knob, why) when the engines cannot run this plan for this run, else None."""
        if full_ft and self.streamed_count(depth) and self.optimizer == "gpu":
            return (
                "OPTIMIZER_PLACEMENT",
                "a full fine-tune with streamed blocks keeps its fp32 masters on the host: use 'stream' or 'host'",
            )
        return None

    def graph_refusal(self, draws_random: bool = False) -> str | None:
        """Why a step under this plan cannot be captured in a CUDA graph, naming the knob, or None: the
        engines that move bytes from Python each step. `draws_random`: the adapter's forward uses dropout,
        so a checkpointed block's recomputation restores the RNG state from the host."""
        if self.stream_blocks != 0:
            return "STREAM_BLOCKS: streamed weights are copied from Python each step"
        if self.activation_offload != "none":
            return "ACTIVATION_OFFLOAD: offloaded activations move through host memory"
        if self.grad_offload:
            return "GRAD_OFFLOAD: gradients leave through host hooks"
        if self.optimizer != "gpu":
            return f"OPTIMIZER_PLACEMENT: '{self.optimizer}' moves optimizer states through the host"
        if self.checkpointing != "none" and draws_random:
            return (
                "CHECKPOINTING: with adapter dropout the recomputation restores the RNG state from the host"
            )
        return None

    def off_card(self) -> tuple[str, Any, Any] | None:
        """(knob, value, the value that keeps it on the card) of the first engine this plan sets to move
        weights, activations, grads or optimizer states off the card, or None."""
        for field, on_card in ON_CARD:
            if getattr(self, field) != on_card:
                return FIELD_KNOBS[field], getattr(self, field), on_card
        return None

    def fsdp_refusal(self) -> tuple[str, str] | None:
        """(knob, why) when this plan's engines cannot run with its blocks sharded: FSDP2 gathers whole
        blocks from sharded weights, grads and states on the card, so nothing streams or offloads and a
        checkpoint holds a whole block."""
        why = "with DISTRIBUTED='fsdp' (from the memory plan: set it, or another MEMORY_PROFILE): FSDP2 needs"
        if self.checkpointing not in FSDP_CHECKPOINTING:
            need = f"one of {list(FSDP_CHECKPOINTING)}"
            return FIELD_KNOBS["checkpointing"], f"'{self.checkpointing}' {why} {need}"
        if moved := self.off_card():
            knob, value, on_card = moved
            return knob, f"{value!r} {why} {on_card!r}"
        return None

    def masters_on_host(self) -> bool:
        """Full fine-tune keeps fp32 masters where its optimizer states live."""
        return self.optimizer != "gpu"

    def knobs(self) -> dict[str, Any]:
        """The plan as knob assignments (what a config file or the catalog prints)."""
        values = asdict(self)
        return {knob: values[f] for knob, f in PLAN_KNOBS.items()}

    def label(self) -> str:
        """A short human label: 'ckpt full/1, stream 42x2, act-offload, grad-offload, opt host'."""
        parts = [
            "no ckpt"
            if self.checkpointing == "none"
            else f"ckpt {self.checkpointing}/{self.checkpoint_every}"
        ]
        if self.stream_blocks:
            n = "all" if self.stream_blocks < 0 else str(self.stream_blocks)
            parts.append(f"stream {n}x{self.stream_slots}")
        if self.activation_offload != "none":
            parts.append("act-offload")
        if self.grad_offload:
            parts.append("grad-offload")
        parts.append(f"opt {self.optimizer}")
        for name, placement in (("te", self.text_encoder), ("vae", self.vae)):
            if placement != "resident":
                parts.append(f"{name} {placement}")
        return ", ".join(parts)


def memory_pins(memory: Any) -> dict[str, Any]:
    """{knob: value} of the per-engine knobs a run's MemoryConfig sets (not None): the fields they pin."""
    values = {knob: getattr(memory, knob.lower()) for knob in PLAN_KNOBS}
    return {knob: value for knob, value in values.items() if value is not None}


def plan_with_overrides(base: MemoryPlan, pins: Mapping[str, Any]) -> MemoryPlan:
    """`base` with every per-engine knob of `pins` ({knob: value}, e.g. `memory_pins`) that is set (not
    None) taking its place."""
    changes = {f: pins[k] for k, f in PLAN_KNOBS.items() if pins.get(k) is not None}
    return replace(base, **changes)


def plan_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(MemoryPlan))
