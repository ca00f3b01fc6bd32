"""Torch model definitions the runtime trains (decoder-only GPT-2 and Llama families)."""

from uniap.models.decoder import (
    FAMILIES,
    DecoderSlice,
    as_trained,
    build_layer,
    build_model,
    check_supported,
    layer_names,
    lm_loss,
)

__all__ = ["FAMILIES", "DecoderSlice", "as_trained", "build_layer", "build_model", "check_supported", "layer_names",
           "lm_loss"]
