"""Chat prompts come from the checkpoint's own template, rendered as transformers renders it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from infertune.engine.chat_template import ChatTemplate, load_chat_template
from infertune.engine.make_model import ensure_model
from infertune.engine.pretrained import PretrainedMissingError, ensure_pretrained
from infertune.engine.protocol import BadRequestError, parse_request

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Colour of the sky?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And grass? ünïcødé 東京"},
    ],
]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    try:
        return ensure_pretrained("smollm2-135m-instruct")
    except PretrainedMissingError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_smollm2_chat_prompt_equals_transformers(smollm2: Path, conversation: list) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2)
    want = hf.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    template = load_chat_template(smollm2)
    assert template is not None
    assert template.render(conversation) == want
    assert want.endswith("<|im_start|>assistant\n")  # ChatML, the model's own format
    tok = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    req = parse_request({"messages": conversation}, tok, chat=True, template=template)
    assert req.prompt_ids == list(hf(want, add_special_tokens=False)["input_ids"])
    assert req.prompt_ids[0] == tok.token_to_id("<|im_start|>")  # a special token, whole


def test_generated_model_keeps_its_template() -> None:
    tiny = ensure_model("tiny")
    template = load_chat_template(tiny)  # tokenizer_config.json's chat_template
    assert template is not None
    text = template.render([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert text == "<|user|>\n[{'type': 'text', 'text': 'hi'}]\n<|assistant|>\n"
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    req = parse_request(parts, tok, chat=True, template=template)
    # Content parts are joined into text first; no <s> is added (the template would write it).
    assert tok.decode(req.prompt_ids, skip_special_tokens=False) == "<|user|>\nhi\n<|assistant|>\n"
    assert req.prompt_ids[0] != tok.token_to_id("<s>")


def test_named_templates_and_special_tokens(tmp_path: Path) -> None:
    config = {
        "bos_token": {"content": "<s>", "special": True},
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_chat_template(tmp_path)
    assert template is not None
    assert template.render([{"role": "user", "content": "x"}]) == "<s>x"
    (tmp_path / "chat_template.jinja").write_text("jinja wins")  # as in transformers
    assert load_chat_template(tmp_path).render([]) == "jinja wins"  # type: ignore[union-attr]


def test_no_template_and_refusals_are_400s(tmp_path: Path) -> None:
    tok = Tokenizer.from_file(str(ensure_model("tiny") / "tokenizer.json"))
    body = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(BadRequestError, match="no chat template"):
        parse_request(body, tok, chat=True, template=load_chat_template(tmp_path))
    strict = ChatTemplate(
        "{% if messages[0]['role'] != 'system' %}"
        "{{ raise_exception('the first message must be the system prompt') }}{% endif %}"
    )
    with pytest.raises(BadRequestError, match="must be the system prompt"):
        parse_request(body, tok, chat=True, template=strict)
    with pytest.raises(BadRequestError, match="chat template failed"):
        parse_request(body, tok, chat=True, template=ChatTemplate("{{ messages[5]['x'] }}"))
