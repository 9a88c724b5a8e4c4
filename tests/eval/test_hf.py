"""Export to transformers: the directory loads with AutoModelForCausalLM / AutoTokenizer
(after ``import open1b_eval.hf``), ``generate`` runs, and its logits agree with the
reproducible runtime's within the stated tolerance (docs/EVAL.md)."""
from __future__ import annotations

import pytest
import torch

from open1b_eval.decoder import Decoder
from open1b_eval.export import export

TEXTS = ["Coulomb wave functions describe the scattering of charged particles in a "
         "central potential, and their asymptotic forms are known in closed form.",
         "def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n",
         "Let n be a positive integer. Then the sum of the first n odd numbers equals n^2."]
# stated agreement, measured on the micro test run (docs/EVAL.md gives the demo run's)
MAX_ABS, MEAN_ABS, TOP1 = 0.08, 0.005, 0.95   # measured: max 0.038, mean 0.0015, top-1 1.0


def agreement(hf_logits: torch.Tensor, rt_logits: torch.Tensor) -> dict[str, float]:
    d = (hf_logits.float() - rt_logits).abs()
    return {"max_abs": d.max().item(), "mean_abs": d.mean().item(),
            "top1": (hf_logits.argmax(-1) == rt_logits.argmax(-1)).float().mean().item()}


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    return export(trained, str(tmp_path_factory.mktemp("hf") / "model"))


def test_export_loads_and_agrees_with_the_runtime(trained, exported):
    import open1b_eval.hf  # noqa: F401  (registers model_type "open1b")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(exported)
    tok = AutoTokenizer.from_pretrained(exported)
    assert type(model).__name__ == "Open1bForCausalLM"
    assert model.layers[0].q.act_step.dtype == torch.float32
    dec = Decoder(trained.cfg, trained.params)
    for text in TEXTS:
        ids = [trained.eot] + tok(text)["input_ids"]
        assert ids == trained.encode_prompt(text)
        x = torch.tensor([ids[:48]])
        with torch.no_grad():
            hf = model(x).logits[0]
        a = agreement(hf, dec.forward(x)[0])
        assert a["max_abs"] <= MAX_ABS and a["mean_abs"] <= MEAN_ABS and a["top1"] >= TOP1, a
    out = model.generate(torch.tensor([trained.encode_prompt("The electric")]),
                         max_new_tokens=5, do_sample=False)
    assert out.shape == (1, len(trained.encode_prompt("The electric")) + 5)
    assert model.config.open1b_source["step"] == trained.step
