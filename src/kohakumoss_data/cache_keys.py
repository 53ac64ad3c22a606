"""Cache keys: everything that changes a cached tensor's content is part of its key."""

from __future__ import annotations

from collections.abc import Sequence

from kohakumoss_common.hashing import canonical_json, sha256_json

from .plan import PlannedItem, reference_item


def latent_key(item: PlannedItem, vae_identity: str) -> str:
    """(image hash, resize, crop box, target size, flip, VAE identity)."""
    x, y = item.crop
    box = [x, y, x + item.target[0], y + item.target[1]]
    return sha256_json(
        {
            "image": item.hash,
            "resize": list(item.resize),
            "crop": box,
            "target": list(item.target),
            "flip": item.flip,
            "vae": vae_identity,
        }
    )


def text_key(
    caption: str, template: str, encoder_identity: str, layer_choice: object, references: Sequence[str] = ()
) -> str:
    """(caption, template, encoder identity, layer choice), and the content hashes of the reference
    images the encoder put in the prompt (in order), when it put any."""
    key = {"caption": caption, "template": template, "encoder": encoder_identity, "layer": layer_choice}
    if references:
        key["references"] = list(references)
    return sha256_json(key)


def latent_cache_identity(vae_identity: str) -> dict[str, str]:
    return {"kind": "latents", "vae": vae_identity}


def text_cache_identity(encoder_identity: str, template: str, layer_choice: object) -> dict[str, str]:
    return {
        "kind": "text",
        "encoder": encoder_identity,
        "template": template,
        "layer": canonical_json(layer_choice),
    }


def reference_keys(item: PlannedItem, vae_identity: str) -> list[str]:
    """The latent keys of an item's references, in order: each is keyed like an image of its own (its
    content, resize, crop, size and the item's flip), so a reference changed on disk is encoded again."""
    return [latent_key(reference_item(item, ref), vae_identity) for ref in item.references]


def item_latent_keys(item: PlannedItem, vae_identity: str) -> list[str]:
    """Every latent one planned item reads: its own, then its references'."""
    return [latent_key(item, vae_identity), *reference_keys(item, vae_identity)]
