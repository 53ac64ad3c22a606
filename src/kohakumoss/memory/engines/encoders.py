"""Where the frozen text encoder and VAE live during training (TEXT_ENCODER_PLACEMENT / VAE_PLACEMENT).

    resident   weights on the training device for the whole run
    streamed   weights in (pinned) host memory; copied to the device for each encode()/decode() call or
               `on_device()` span and dropped from it afterwards
    off        weights in host memory; encode()/decode() outside `on_device()` raise a DataError naming the
               knob (the cache must hit); `on_device()` still loads them for sampling and validation

The weights are swapped in place through `tensor.data` (they are frozen, so the host copy stays exact):
the wrapped encoder keeps its own code paths and its `device` follows its weights. A lock serialises
device spans, because the loader's feeder thread encodes while the main thread may be sampling.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from kohakumoss.memory.plan import ENCODER_PLACEMENTS
from kohakumoss_common.errors import ConfigError, DataError

HOST = torch.device("cpu")
_KNOB = {"text": "TEXT_ENCODER_PLACEMENT", "vae": "VAE_PLACEMENT"}
_CACHE_SCRIPT = {"text": "scripts/data/cache_text.py", "vae": "scripts/data/cache_latents.py"}


def encoder_kind(encoder: Any) -> str:
    """'vae' for an image VAE (it decodes), 'text' for a caption encoder."""
    return "vae" if callable(getattr(encoder, "decode", None)) else "text"


def encoder_tensors(encoder: Any) -> list[torch.Tensor]:
    """The encoder's weights: its `model`'s parameters and buffers, and its own tensor attributes."""
    found: dict[int, torch.Tensor] = {}
    model = getattr(encoder, "model", None)
    if isinstance(model, nn.Module):
        for t in [*model.parameters(), *model.buffers()]:
            found.setdefault(id(t), t)
    for value in vars(encoder).values():
        if isinstance(value, torch.Tensor):
            found.setdefault(id(value), value)
        elif isinstance(value, nn.Module) and value is not model:
            for t in [*value.parameters(), *value.buffers()]:
                found.setdefault(id(t), t)
    return list(found.values())


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    host = t.detach() if t.device == HOST else t.detach().to(HOST)
    return host.pin_memory() if pin and not host.is_pinned() else host


def _device_copy(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    # a fresh buffer even when device is the host: the span never writes into the kept host copy
    return torch.empty_like(host, device=device).copy_(host, non_blocking=True)


class PlacedEncoder:
    """A text encoder or VAE with a placement; every other attribute is the wrapped encoder's."""

    def __init__(self, encoder: Any, placement: str, device: torch.device, knob: str | None = None):
        kind = encoder_kind(encoder)
        self.knob = knob or _KNOB[kind]
        if placement not in ENCODER_PLACEMENTS:
            raise ConfigError(self.knob, f"'{placement}' is not one of {ENCODER_PLACEMENTS}")
        self.inner, self.placement, self.compute_device = encoder, placement, torch.device(device)
        self.kind = kind
        self.loads = 0  # how many times the weights were copied to the device (streamed / off spans)
        self._lock = threading.RLock()
        self._depth = 0
        self._tensors = encoder_tensors(encoder)
        pin = placement == "streamed" and self.compute_device.type == "cuda" and torch.cuda.is_available()
        if placement == "resident":
            self._hosts: list[torch.Tensor] = []
            for t in self._tensors:
                if t.device != self.compute_device:
                    t.data = t.data.to(self.compute_device)
            self._set_device(self.compute_device)
        else:
            self._hosts = [_host_copy(t, pin) for t in self._tensors]
            self._release()

    def _set_device(self, device: torch.device) -> None:
        """Synthetic encoders carry their device as a plain attribute; real ones derive it from weights."""
        if "device" in vars(self.inner):
            self.inner.device = device

    def _release(self) -> None:
        for t, host in zip(self._tensors, self._hosts):
            t.data = host
        self._set_device(HOST)

    @property
    def device(self) -> torch.device:
        """The device the encoder computes on (its weights may rest on the host between calls)."""
        return self.compute_device

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors)

    @contextmanager
    def on_device(self) -> Iterator[PlacedEncoder]:
        """The weights on the device for the span (sampling, validation, cache building); re-entrant."""
        with self._lock:
            if self._depth == 0 and self.placement != "resident":
                for t, host in zip(self._tensors, self._hosts):
                    t.data = _device_copy(host, self.compute_device)
                self._set_device(self.compute_device)
                self.loads += 1
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
                if self._depth == 0 and self.placement != "resident":
                    self._release()

    def _call(self, method: str, *args, **kwargs):
        with self._lock:
            if self._depth > 0 or self.placement == "resident":
                return getattr(self.inner, method)(*args, **kwargs)
            if self.placement == "off":
                what = "text cache" if self.kind == "text" else "latent cache"
                raise DataError(
                    f"{self.knob}='off' but {method}() was called outside sampling (the {what} missed): "
                    f"fill the cache first with {_CACHE_SCRIPT[self.kind]}, or set {self.knob}='streamed' "
                    "or 'resident'"
                )
            with self.on_device():
                return getattr(self.inner, method)(*args, **kwargs)

    def encode(self, *args, **kwargs):
        return self._call("encode", *args, **kwargs)

    def decode(self, *args, **kwargs):
        if not callable(getattr(self.inner, "decode", None)):
            raise AttributeError(f"{type(self.inner).__name__} has no decode")
        return self._call("decode", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # only reached for names the wrapper lacks: identity, template, layer_choice, dtype, hidden_size, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"PlacedEncoder({type(self.inner).__name__}, {self.placement}, {self.compute_device})"


def place_encoder(
    encoder: Any, placement: str, device: torch.device | str, knob: str | None = None
) -> PlacedEncoder | None:
    """Wrap `encoder` (TextEncoder, ImageVAE or a synthetic one; None passes through) with `placement`.

    `knob` names the placement knob in errors; by default TEXT_ENCODER_PLACEMENT or VAE_PLACEMENT by kind.
    """
    if encoder is None:
        return None
    if isinstance(encoder, PlacedEncoder):
        encoder = encoder.inner
    return PlacedEncoder(encoder, placement, torch.device(device), knob)
