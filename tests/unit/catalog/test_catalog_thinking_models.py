"""Which catalog models reason: a chat template that writes a thought (`<think>`...
`</think>`, as Qwen3's) in the GGUF's header or in models.toml marks the model on
`/v1/models`; a plain template does not. Header-only GGUFs (tests/models.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from app.catalog import Catalog
from app.catalog.header import read_facts
from app.engine.registry import catalog_card
from app.wire.inference import CatalogModel, Model
from tests.models import header_model

#: A Qwen3-like template, cut to what says it thinks: the tags and the switch.
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_a_thinking_template_in_the_header_or_models_toml_marks_the_model(
    make_catalog: Callable[..., Catalog], data_dir: Path
) -> None:
    models = data_dir / "models"
    [thinking] = header_model(models / "qwen3-tiny-Q4_K_M.gguf", chat_template=THINKING)
    header_model(models / "plain-Q4_K_M.gguf")
    header_model(models / "told-Q4_K_M.gguf")
    (data_dir / "models.toml").write_text(
        '["told-Q4_K_M"]\nchat_template = "<think>{{ messages }}</think>"\n'
    )
    assert read_facts([thinking]).chat_template == THINKING

    cards = {e.id: catalog_card(e) for e in make_catalog().entries()}
    said = {i: c["reasoning"] for i, c in cards.items() if i.endswith("Q4_K_M")}
    assert said == {"qwen3-tiny-Q4_K_M": True, "plain-Q4_K_M": False, "told-Q4_K_M": True}
    # As /v1/models sends them (app/api/inference.py): an extra field beside OpenAI's.
    sent = msgspec.json.decode(msgspec.json.encode(CatalogModel(**cards["qwen3-tiny-Q4_K_M"])))
    assert sent["reasoning"] is True
    # An upstream's model card is OpenAI's own: whether it reasons is not known, not said.
    upstream = msgspec.json.decode(msgspec.json.encode(Model(id="gpt-4o", created=0)))
    assert "reasoning" not in upstream
