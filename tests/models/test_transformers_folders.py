"""Folders transformers saves, loaded as transformers loads them (issue 59): transformers 5 builds the
ViT family with new parameter names and renames a saved folder's keys as it loads it (its conversion
mapping, which covers ViT, DeiT, BEiT, ...); `model=hf_encoder model.weights=<folder>` loads a folder
the same way, so the encoder equals transformers' own, builds whole into one engine whose network the
CPU reference executor finds right, and a folder that does not fit its config is one line. Whisper
from a folder (`model=whisper`) takes its sizes from the folder's config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import ConfigError

FAMILIES = {"vit": ("ViTModel", "ViTConfig"), "dinov2": ("Dinov2Model", "Dinov2Config"),
            "deit": ("DeiTModel", "DeiTConfig"), "beit": ("BeitModel", "BeitConfig")}
IMAGE = "model.methods.forward.inputs=[{shape: [1, 3, 32, 32]}]"


def _folder(path: Path, family: str) -> Path:
    import transformers

    model_class, config_class = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=64, image_size=32, patch_size=8)
    getattr(transformers, model_class)(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_vit_family_folder_loads_as_transformers_loads_it(family: str, tmp_path: Path) -> None:
    import transformers
    from safetensors import safe_open

    folder = _folder(tmp_path / family, family)
    reference = transformers.AutoModel.from_pretrained(folder, local_files_only=True, attn_implementation="eager").eval()
    with safe_open(str(folder / "model.safetensors"), "pt") as saved:
        renamed = set(saved.keys()) != set(reference.state_dict())
    encoder = objects.model(typed(compose(["model=hf_encoder", f"model.weights={folder}", IMAGE])))  # type: ignore[arg-type]
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = reference(pixel_values=x).last_hidden_state
        assert torch.equal(encoder(x), want), family
    assert renamed or family == "dinov2"  # the folder's keys are not the model's: transformers mapped them


def test_a_vit_folder_builds_whole_and_its_network_is_right(tmp_path: Path) -> None:
    from pipeline.steps import run_all

    folder = _folder(tmp_path / "vit", "vit")
    run_all(typed(compose(["model=hf_encoder", f"model.weights={folder}", IMAGE, "cache=off"])), tmp_path / "build")  # type: ignore[arg-type]
    report = json.loads((tmp_path / "build" / "report.json").read_text())["forward"]
    assert report["left_over"] == [] and report["num_engines"] == 1
    (engine,) = report["engines"]
    assert engine["reference"]["max_rel_error"] <= 1e-3, engine["reference"]


def test_a_folder_that_does_not_fit_is_one_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "vit", "vit")
    config = json.loads((folder / "config.json").read_text())

    def refused(*overrides: str) -> str:
        with pytest.raises(ConfigError) as err:
            objects.model(typed(compose(["model=hf_encoder", f"model.weights={folder}", IMAGE, *overrides])))  # type: ignore[arg-type]
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "drop model.weight_prefixes" in refused("+model.weight_prefixes={module.: ''}")
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    assert "lacks" in refused()  # the third layer: nothing in the folder sets it
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    assert "key(s) the model does not have" in refused()
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    assert "differ in shape" in refused() or "cannot load its weights" in refused()
    (folder / "config.json").write_text(json.dumps(config))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert "is not safetensors (truncated or another format" in refused()


def test_whisper_from_a_folder_takes_the_folders_sizes(tmp_path: Path) -> None:
    """`model=whisper model.weights=<folder>`: a Whisper of sizes no config names here (d_model 96,
    three encoder layers and one decoder layer, 300 tokens) gives transformers' encoder states and
    logits."""
    import transformers

    torch.manual_seed(0)
    config = transformers.WhisperConfig(d_model=96, encoder_layers=3, decoder_layers=1, encoder_attention_heads=4,
                                        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=300,
                                        max_target_positions=64, decoder_start_token_id=1, eos_token_id=2, pad_token_id=0,
                                        bos_token_id=1)
    transformers.WhisperForConditionalGeneration(config).save_pretrained(tmp_path / "whisper")
    model = objects.model(typed(compose(["model=whisper", f"model.weights={tmp_path / 'whisper'}"])))  # type: ignore[arg-type]
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(
        tmp_path / "whisper", local_files_only=True, attn_implementation="eager").eval()
    features, tokens = torch.randn(1, 80, 3000), torch.tensor([[1, 5, 7, 299]])
    with torch.no_grad():
        assert torch.allclose(model.encoder(features), reference.model.encoder(features).last_hidden_state, atol=1e-5)
        want = reference(input_features=features, decoder_input_ids=tokens).logits
        assert torch.allclose(model.text_decoder(tokens, torch.tensor([0])), want, atol=1e-5)
