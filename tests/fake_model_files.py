"""Minimal stand-ins for SGLang model files, written by the tests (not SGLang's code).

:func:`write_deepseek_file` writes a ``srt/models/deepseek_v2.py`` with the
pieces :mod:`pytest_eagle3.sglang_source.model_code` reads: an ``EntryClass``, a
causal-LM class whose ``set_eagle3_layers_to_capture`` applies one id rule, and
an inner model whose ``forward`` capture loop either adds ``residual`` while it
is still ``None`` before layer 0 (no layer-0 capture) or hands the capture to
the decoder layer.
"""

from __future__ import annotations

from pathlib import Path

ALWAYS = "always"
FIRST_IS_ONE = "first-is-one"

_RULES = {
    ALWAYS: "            self.model.layers_to_capture = [v + 1 for v in layer_ids]\n",
    FIRST_IS_ONE: ("            if layer_ids and layer_ids[0] == 1:\n"
                   "                self.model.layers_to_capture = [v + 1 for v in layer_ids]\n"
                   "            else:\n"
                   "                self.model.layers_to_capture = list(layer_ids)\n"),
}

_LOOP_ADDS_RESIDUAL = """\
        residual = None
        aux = []
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](hidden_states, residual)
        return hidden_states, aux
"""
_LOOP_IN_LAYER = """\
        aux = []
        for i in range(len(self.layers)):
            hidden_states = self.layers[i](
                hidden_states, capture=aux if i in self.layers_to_capture else None)
        return hidden_states, aux
"""


def deepseek_source(rule: str = FIRST_IS_ONE, *, layer0: bool = True, eagle3: bool = True) -> str:
    method = ("    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
              "        if not self.pp_group.is_last_rank:\n"
              "            return\n"
              "        if layer_ids is None:\n"
              "            n = self.config.num_hidden_layers\n"
              "            self.model.layers_to_capture = [2, n // 2, n - 3]\n"
              "        else:\n" + _RULES[rule]) if eagle3 else ""
    return (
        "class DeepseekV2Model:\n"
        "    def __init__(self, config):\n"
        "        self.layers_to_capture = []\n"
        "        self.layers = []\n\n"
        "    def forward(self, hidden_states):\n"
        + (_LOOP_IN_LAYER if layer0 else _LOOP_ADDS_RESIDUAL) + "\n\n"
        "class DeepseekV2ForCausalLM:\n"
        "    def __init__(self, config):\n"
        "        self.config = config\n"
        "        self.model = DeepseekV2Model(config)\n\n"
        + method + "\n\n"
        "class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):\n"
        "    pass\n\n\n"
        "EntryClass = [DeepseekV2ForCausalLM, DeepseekV3ForCausalLM]\n"
    )


def write_deepseek_file(package: Path, rule: str = FIRST_IS_ONE, *, layer0: bool = True,
                        eagle3: bool = True) -> Path:
    """Write ``<package>/srt/models/deepseek_v2.py``; returns the file."""
    models = Path(package) / "srt" / "models"
    models.mkdir(parents=True, exist_ok=True)
    path = models / "deepseek_v2.py"
    path.write_text(deepseek_source(rule, layer0=layer0, eagle3=eagle3))
    return path


def like_release(version: str) -> dict:
    """The ``rule``/``layer0`` keywords of a fake of upstream release ``version``
    (upstream's DeepSeek model: always +1 through 0.5.12, layer 0 from 0.5.14)."""
    from pytest_eagle3.conventions import ALWAYS_PLUS_ONE, captures_embedding, rule_for

    return {"rule": ALWAYS if rule_for(version) == ALWAYS_PLUS_ONE else FIRST_IS_ONE,
            "layer0": captures_embedding(version)}
