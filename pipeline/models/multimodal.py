"""Causal LMs that read images or audio (Gemma 3 with images, Voxtral) as programs of two methods that
share the program's state. The encoder method (`vision_encoder`: pixels [1, 3, H, W]; `audio_encoder`:
log-mel features [1, mels, frames] of one window) computes the token embeddings one image or audio
window stands for, writes them into the program's state at the `slot` it is given, and returns them.
`text_decoder(tokens, start)` is a decoder step (`pipeline.models.hf.Decoder.step`): tokens at
positions start..start+T-1, their logits; where a token is the model's placeholder (its
`image_token_id` or `audio_token_id`), the step embeds the state's next media row instead, in order
(the k-th placeholder of the step takes row k), as transformers' model splices them. Gemma 3's image
tokens attend to each other both ways: the step makes the masks transformers makes from the
`token_type_ids` its processor gives (1 at the placeholders). So a prompt's placeholders all go in one
step (the prompt's), after the encoder ran for each of its images or windows; `pipeline.runtime.media`
runs the two. Families the tests do not name (LLaVA) build where their rows only replace their image
tokens, checked against transformers when built.

The embedding table is in the text decoder's engine once (a tied LM head shares it), and a decoder
program's `generate` runs a multimodal program on text alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipeline import dtypes
from pipeline.errors import ConfigError
from pipeline.models.hf import Decoder
from pipeline.models.hf_folder import folder_config, from_folder
from pipeline.models.registry import model_factory
from pipeline.runtime.generate import PLACEHOLDER_METHOD as PLACEHOLDER
from pipeline.runtime.media import FRAMES, ROWS, SLOTS


@dataclass(frozen=True)
class Family:
    """What a multimodal family reads, the transformers class that builds it, its placeholder token's
    config field, whether its placeholders attend both ways (`token_type_ids`), and whether a build
    checks the spliced step against transformers (a family the tests do not check: `_check_splice`)."""

    media: str  # "image" or "audio"
    model_class: str
    placeholder: str
    both_ways: bool = False
    checked: bool = False


FAMILIES = {"gemma3": Family("image", "Gemma3ForConditionalGeneration", "image_token_id", both_ways=True),
            "voxtral": Family("audio", "VoxtralForConditionalGeneration", "audio_token_id")}
CONFIGS = {"image": "image_text_decoder", "audio": "audio_text_decoder"}  # conf/model/<name>.yaml of each media


class MediaDecoder(Decoder):
    """A `transformers` multimodal causal LM with its KV cache and media rows as state (batch 1)."""

    media: torch.Tensor  # [1, slots * rows, hidden]: the rows the encoder wrote (a buffer, `_add_state`)

    def __init__(self, model: Any, max_cache_len: int, tokenizer: str | None, family: Family, slots: int) -> None:
        self.family = family
        self.placeholder = int(getattr(model.config, family.placeholder))
        vocab = int(model.config.get_text_config().vocab_size)
        if not 0 <= self.placeholder < vocab:
            raise ConfigError(f"the model's {family.placeholder} {self.placeholder} is not a token of its vocabulary of {vocab}; "
                              "a program embeds every token it is given, so it cannot take this folder")
        self.rows = _rows(model, family)
        self.slots = slots
        super().__init__(model, max_cache_len, tokenizer)

    def _add_state(self, model: Any) -> None:
        """The media rows the encoder writes and the steps read: `slots` images or windows."""
        width = model.config.get_text_config().hidden_size
        self.register_buffer("media", torch.zeros(1, self.slots * self.rows, width, dtype=model.dtype, device=model.device),
                             persistent=False)

    def _reset_cache(self) -> None:
        super()._reset_cache()
        self.media.zero_()

    @property
    def program_constants(self) -> dict[str, int | str]:
        audio = {FRAMES: _window(self._conditional.config)[2]} if self.family.media == "audio" else {}
        return {**super().program_constants, PLACEHOLDER: self.placeholder, ROWS: self.rows, SLOTS: self.slots, **audio}

    @property
    def _conditional(self) -> Any:
        return self.model.model

    def vision_encoder(self, pixels: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """An image's pixels [1, 3, H, W] (as the folder's image processor makes them) -> its rows of
        token embeddings [1, rows, hidden], written into the state at `slot` ([1])."""
        self._media_is("image")
        self._takes(pixels, _pixels(self._conditional.config), "vision_encoder")
        return self._keep(_rows_of(self._conditional.get_image_features(pixel_values=pixels).pooler_output), slot)

    def audio_encoder(self, features: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """One window's log-mel features [1, mels, frames] (as the folder's feature extractor makes
        them) -> its rows of token embeddings [1, rows, hidden], written into the state at `slot` ([1])."""
        self._media_is("audio")
        self._takes(features, _window(self._conditional.config), "audio_encoder")
        return self._keep(_rows_of(self._conditional.get_audio_features(features).pooler_output), slot)

    def _media_is(self, media: str) -> None:
        if self.family.media != media:
            raise ConfigError(f"a {type(self._conditional).__name__} reads {self.family.media}, not {media}: build it with "
                              f"model={CONFIGS[self.family.media]}")

    @staticmethod
    def _takes(item: torch.Tensor, shape: tuple[int, ...], method: str) -> None:
        if tuple(item.shape) != shape:
            want = ",".join(map(str, shape))
            raise ConfigError(f"model.methods.{method}.inputs[0] has shape {list(item.shape)}; the folder's model takes "
                              f"{list(shape)}: set model.methods.{method}.inputs.0.shape=[{want}]")

    def _keep(self, rows: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        if rows.shape[1] != self.rows:
            raise ConfigError(f"the encoder gives {rows.shape[1]} rows where the model's config says {self.rows}; a "
                              "program of this folder cannot splice them")
        at = slot.clamp(0, self.slots - 1) * self.rows + torch.arange(self.rows, device=rows.device)
        self.media.index_copy_(1, at, rows.to(self.media.dtype))
        return rows

    def step(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Tokens [1, T] at positions start..start+T-1 (`start`: [1]); their logits [1, T, vocab]. A
        placeholder token takes the state's next media row in place of its embedding."""
        placed = tokens == self.placeholder
        embedded = self._conditional.get_input_embeddings()(tokens)  # the placeholder is a token of the vocabulary
        order = (torch.cumsum(placed.to(torch.int64), dim=1) - 1).clamp(0, self.media.shape[1] - 1)
        spliced = torch.where(placed[..., None], self.media[0, order[0]][None].to(embedded.dtype), embedded)
        positions = torch.arange(tokens.shape[1], device=tokens.device) + start
        given = {"attention_mask": self._masks(placed[0], positions)} if self.family.both_ways else {}
        return self._run(positions, inputs_embeds=spliced, **given)

    def _masks(self, placed: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """The attention masks transformers makes from a step's `token_type_ids` (the placeholders), by
        layer kind [1, 1, T, cache] (True: attend): causal, or both tokens of one image (a run of
        placeholders in this step); sliding layers also within the window. Made here rather than by
        transformers, whose masks from token types fix the step's length."""
        cache = torch.arange(self.max_cache_len, device=positions.device)
        starts = placed & ~torch.nn.functional.pad(placed, (1, 0))[:-1]
        blocks = torch.where(placed, torch.cumsum(starts.to(torch.int64), 0) - 1, -1)  # the image of each token, -1: text
        inside = cache - positions[0]
        kept = (inside >= 0) & (inside < placed.shape[0])
        cache_blocks = torch.where(kept, blocks[inside.clamp(0, placed.shape[0] - 1)], -1)
        same = (blocks[:, None] == cache_blocks[None, :]) & (blocks[:, None] >= 0)
        full = (cache[None, :] <= positions[:, None]) | same
        masks = {"full_attention": full[None, None]}
        window = getattr(self._conditional.config.get_text_config(), "sliding_window", None)
        if window:
            masks["sliding_attention"] = (full & (cache[None, :] > positions[:, None] - int(window)))[None, None]
        return masks

    def text_decoder(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return self.step(tokens, start)


def _rows_of(found: Any) -> torch.Tensor:
    """An encoder's rows [1, rows, hidden], from what transformers gives (per image a list, or one tensor)."""
    rows = torch.cat(list(found)) if isinstance(found, (list, tuple)) else found
    return rows.reshape(1, -1, rows.shape[-1])


def _pixels(cfg: Any) -> tuple[int, ...]:
    """The pixels [1, channels, size, size] of one image, as the model's vision config gives them."""
    vision = cfg.vision_config
    size = getattr(vision, "image_size", None)
    if not isinstance(size, int):
        raise ConfigError(f"a {type(cfg).__name__}'s vision config gives no one image size; model=image_text_decoder builds "
                          "families whose images are of one size")
    return (1, int(getattr(vision, "num_channels", 3)), size, size)


def _window(cfg: Any) -> tuple[int, ...]:
    """The log-mel features [1, mels, frames] of one audio window, as the model's audio config gives them
    (its encoder's positions, each two frames: its second convolution's stride)."""
    audio = cfg.audio_config
    return (1, int(audio.num_mel_bins), 2 * int(audio.max_source_positions))


def _rows(model: Any, family: Family) -> int:
    """The token embeddings one image or audio window stands for: from the model's config, or (an image
    family of no known count) as its encoder gives them for an image of its size, found without computing."""
    cfg = model.config
    if family.media == "image" and hasattr(cfg, "mm_tokens_per_image"):
        return int(cfg.mm_tokens_per_image)
    if family.media == "image":
        from torch._subclasses.fake_tensor import FakeTensorMode

        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as fake:
            pixels = fake.from_tensor(torch.zeros(_pixels(cfg), dtype=model.dtype))
            return int(_rows_of(model.model.get_image_features(pixel_values=pixels).pooler_output).shape[1])
    audio = cfg.audio_config  # the encoder's positions, regrouped into rows of intermediate_size (its projector's input)
    width = int(audio.max_source_positions) * int(audio.hidden_size)
    if width % int(audio.intermediate_size):
        raise ConfigError(f"the audio encoder's {audio.max_source_positions} positions of {audio.hidden_size} do not "
                          f"regroup into rows of intermediate_size {audio.intermediate_size}; transformers cannot run it either")
    return width // int(audio.intermediate_size)


def _build(media: str, folder: str | None, max_cache_len: int, dtype: str | None, slots: int, config: dict[str, Any]) -> MediaDecoder:
    import transformers

    from pipeline.runtime import tokenizer

    name = CONFIGS[media]
    if folder is None:
        raise ConfigError(f"model={name} builds from a Hugging Face model folder (model.weights=<folder>); give one")
    if int(max_cache_len) < 1 or int(slots) < 1:
        raise ConfigError(f"model.kwargs.max_cache_len = {max_cache_len} and model.kwargs.slots = {slots} must be at least 1")
    cfg = folder_config(folder, None, config)
    family = _family(cfg, media, folder)
    dtype = dtype or (str(cfg.dtype).removeprefix("torch.") if cfg.dtype is not None else "float32")
    row = dtypes.by_name(dtype)
    if row is None or not row.torch.is_floating_point:
        raise ConfigError(f"model.kwargs.dtype = {dtype!r} is not a floating-point dtype")
    cfg._attn_implementation = "sdpa"
    model, loaded = from_folder(getattr(transformers, family.model_class), cfg, folder, row.torch)
    model = model.to(row.torch).eval().requires_grad_(False)
    built = MediaDecoder(model, int(max_cache_len), tokenizer.from_folder(folder), family, int(slots)).eval()
    built.folder_loading = loaded
    if family.checked:
        _check_splice(built)
    return built


def _family(cfg: Any, media: str, folder: str) -> Family:
    """The family of a folder's config: one the tests check (`FAMILIES`), or a causal LM of transformers'
    image-text-to-text classes that splices image rows as they do (checked when built).

    Raises:
        ConfigError: a family of the other media, or one whose images are placed by more than their tokens.
    """
    import inspect

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as IMAGE_TEXT

    name, where = CONFIGS[media], f"model folder {folder!r} is a {cfg.model_type!r} model"
    known = FAMILIES.get(cfg.model_type)
    if known is not None and known.media != media:
        raise ConfigError(f"{where}, which reads {known.media}: build it with model={CONFIGS[known.media]}")
    if known is not None:
        return known
    found = getattr(transformers, IMAGE_TEXT.get(cfg.model_type, ""), None)
    if media == "audio" or found is None or not hasattr(found, "get_image_features") or not hasattr(cfg, "image_token_id"):
        kinds = sorted(k for k, f in FAMILIES.items() if f.media == media)
        raise ConfigError(f"{where}; model={name} builds {kinds}" + (" and image-text models of transformers whose image "
                          "rows replace their image tokens" if media == "image" else ""))
    encode = inspect.signature(found.get_image_features).parameters.values()
    needs = [p.name for p in encode if p.name not in ("self", "pixel_values") and p.default is p.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if needs or "token_type_ids" in inspect.signature(found.forward).parameters:
        by = needs[0] if needs else "token_type_ids"
        raise ConfigError(f"{where}: a {found.__name__} places its images by {by} besides their tokens, which "
                          f"model={name} does not make; it builds {sorted(k for k, f in FAMILIES.items() if f.media == media)} "
                          "and image-text models whose image rows only replace their image tokens")
    return Family("image", found.__name__, "image_token_id", checked=True)


def _check_splice(built: MediaDecoder) -> None:
    """A family the tests do not check: a random image of the model's size and a prompt holding its rows
    give, spliced as the program splices them, the logits transformers gives.

    Raises:
        ConfigError: they differ (the family places image tokens its own way).
    """
    model = built._conditional
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(_pixels(model.config), generator=generator).to(model.dtype)
    vocab = int(model.config.get_text_config().vocab_size)
    text = torch.randint(0, vocab, (1, 4), generator=generator)
    text = torch.where(text == built.placeholder, (text + 1) % vocab, text)
    ids = torch.cat([text[:, :2], torch.full((1, built.rows), built.placeholder), text[:, 2:]], dim=1)
    with torch.no_grad():
        want = model(input_ids=ids, pixel_values=pixels).logits.float()
        built.vision_encoder(pixels, torch.zeros(1, dtype=torch.int64))
        got = built.step(ids, torch.zeros(1, dtype=torch.int64)).float()
    built._reset_cache()
    worst = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
    if worst > (1e-3 if model.dtype == torch.float32 else 5e-2):
        raise ConfigError(f"a {type(model).__name__} with its image rows spliced in place of its image tokens does not give "
                          f"the logits transformers gives (relative difference {worst:.2g}): it places image tokens its own "
                          f"way, so it cannot build as model=image_text_decoder")


@model_factory
def image_text_decoder(max_cache_len: int = 0, dtype: str | None = None, slots: int = 1, *, folder: str | None = None,
                       **config: Any) -> torch.nn.Module:
    """A causal LM that reads images (Gemma 3), from a model `folder`: a `vision_encoder` and a
    `text_decoder` with a KV cache of `max_cache_len` positions and room for `slots` images, weights
    in `dtype` (default: the folder's), fields of its config overridden by `config`.

    Raises:
        ConfigError: no folder, a folder of a family that does not read images, or sizes below 1.
    """
    return _build("image", folder, max_cache_len, dtype, slots, config)


@model_factory
def audio_text_decoder(max_cache_len: int = 0, dtype: str | None = None, slots: int = 1, *, folder: str | None = None,
                       **config: Any) -> torch.nn.Module:
    """A causal LM that reads audio (Voxtral), from a model `folder`: an `audio_encoder` of one window
    and a `text_decoder` with a KV cache of `max_cache_len` positions and room for `slots` windows,
    weights in `dtype` (default: the folder's), fields of its config overridden by `config`.

    Raises:
        ConfigError: no folder, a folder of a family that does not read audio, or sizes below 1.
    """
    return _build("audio", folder, max_cache_len, dtype, slots, config)
