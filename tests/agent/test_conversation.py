"""The agent's format and token-in-token-out conversations, with real tokenizers and chat templates."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast

from rl360cli.agent.conversation import (ConversationTokens, format_observation, observation_ids, parse_action,
                                         prompt_ids)

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Like Qwen3's: the last assistant turn carries an (empty) think block that earlier turns lose once
# another message follows, and tool results go into a user turn.
QWEN3_LIKE = (
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if loop.last %}<think>\n\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def byte_tokenizer(template: str) -> PreTrainedTokenizerFast:
    vocab = {chr(i): i for i in range(256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="\x00"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    fast.chat_template = template
    return fast


@pytest.mark.parametrize("reply,kind,command", [
    ("```bash\necho hi > a\n```", "bash", "echo hi > a"),
    ("let me look\n```sh\nls -la\n```\nthen", "bash", "ls -la"),
    # Only bash and sh blocks act: a bare fence, a python block and the prose between blocks do not.
    ("```\ncat x\n```", "submit", ""),
    ("```python\nprint(1)\n```\nrm -rf /app\n```bash\nls\n```", "bash", "ls"),
    # A block drafted while thinking is not an action.
    ("<think>\n```bash\nrm -rf /app\n```\n</think>\nAll good.", "submit", ""),
    ("done", "submit", ""),
])
def test_parse_action(reply, kind, command):
    action = parse_action(reply)
    assert (action.kind, action.command) == (kind, command)


def test_format_observation_truncates_and_says_so():
    text = format_observation(0, "x" * 30, max_chars=10)
    assert text == "[exit code 0]\n" + "x" * 10 + "\n[... 20 more characters]"
    assert format_observation(None, "", timed_out=True) == "[timed out]"


QWEN3_NEXT = "<|im_start|>user\n<tool_response>\n[exit code 0]\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("template,kwargs,next_turn", [
    (CHATML, {}, "<|im_start|>tool\n[exit code 0]<|im_end|>\n<|im_start|>assistant\n"),
    (QWEN3_LIKE, {}, QWEN3_NEXT),
    (QWEN3_LIKE, {"enable_thinking": False}, QWEN3_NEXT + "<think>\n\n</think>\n\n"),
])
def test_conversation_tokens_follow_the_template(template, kwargs, next_turn):
    tok = byte_tokenizer(template)
    conv = ConversationTokens(tok, [{"role": "user", "content": "do it"}], template_kwargs=kwargs)
    reply = "```bash\necho 1\n```"
    reply_ids = tok.encode(reply + "<|im_end|>\n", add_special_tokens=False)
    conv.add_generated(reply_ids, [-0.5] * len(reply_ids), version=3)
    conv.add_observation("[exit code 0]")
    text = tok.decode(conv.token_ids)
    # What the engine sees next: its own reply as it generated it, the observation, a fresh generation prompt.
    assert text.endswith(reply + "<|im_end|>\n" + next_turn)
    # Only the generated tokens are trained on, with the engine's logprobs.
    assert sum(conv.loss_mask) == len(reply_ids)
    assert [lp for lp, m in zip(conv.logprobs, conv.loss_mask) if m] == [-0.5] * len(reply_ids)
    assert conv.turn_versions == [3]


def test_an_engine_that_stops_at_im_end_gets_the_templates_newline_before_the_observation():
    """SGLang and rl360's engine stop at `<|im_end|>`; the ChatML template has `<|im_end|>\n`: the `\n`
    the engine never emits is appended, so the next turn reads exactly as the template renders it."""
    tok = byte_tokenizer(CHATML)
    conv = ConversationTokens(tok, [{"role": "user", "content": "q"}])
    reply = tok.encode("ls", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    conv.add_generated(reply, [0.0] * len(reply), version=0)
    conv.add_observation("[exit code 0]")
    assert tok.decode(conv.token_ids) == tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ls"},
         {"role": "tool", "content": "[exit code 0]"}], add_generation_prompt=True, tokenize=False)


def test_an_unfinished_turn_gets_the_end_of_turn_before_the_observation():
    tok = byte_tokenizer(CHATML)
    conv = ConversationTokens(tok, [{"role": "user", "content": "q"}])
    cut = tok.encode("```bash\necho", add_special_tokens=False)
    conv.add_generated(cut, [0.0] * len(cut), version=0)
    conv.add_observation("[timed out]")
    assert tok.decode(conv.token_ids).endswith("echo<|im_end|>\n<|im_start|>tool\n[timed out]<|im_end|>\n"
                                               "<|im_start|>assistant\n")


def test_observation_role_user():
    tok = byte_tokenizer(CHATML)
    ids = observation_ids(tok, "out", role="user")
    assert tok.decode(ids) == "<|im_start|>user\nout<|im_end|>\n<|im_start|>assistant\n"


def counting_renders(tok):
    """`tok` with its chat template's renderings counted (in `tok.renders`)."""
    render = tok.apply_chat_template
    tok.renders = 0

    def counted(*args, **kwargs):
        tok.renders += 1
        return render(*args, **kwargs)

    tok.apply_chat_template = counted
    return tok


@pytest.mark.parametrize("template,kwargs,head,tail", [
    (CHATML, {}, "<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n"),
    (QWEN3_LIKE, {"enable_thinking": False}, "<|im_start|>user\n<tool_response>\n",
     "\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
])
def test_observations_are_framed_without_rendering_the_template_each_time(template, kwargs, head, tail):
    tok = counting_renders(byte_tokenizer(template))
    texts = ["[exit code 0]", "  padded\n\n", "<&>{% raw %}\n\tx"]
    decoded = [tok.decode(observation_ids(tok, text, template_kwargs=kwargs)) for text in texts]
    assert decoded == [head + text + tail for text in texts]
    renders = tok.renders
    assert renders <= 3  # the end of turn and two probes, once for this tokenizer, role and arguments
    observation_ids(tok, "again", template_kwargs=kwargs)
    assert tok.renders == renders


def test_a_template_that_changes_the_observation_is_rendered_for_each_one():
    tok = counting_renders(byte_tokenizer(CHATML.replace("{{ m.content }}", "{{ m.content | trim }}")))
    assert tok.decode(observation_ids(tok, "  out \n")) == "<|im_start|>tool\nout<|im_end|>\n<|im_start|>assistant\n"
    renders = tok.renders
    assert tok.decode(observation_ids(tok, " b ")) == "<|im_start|>tool\nb<|im_end|>\n<|im_start|>assistant\n"
    assert tok.renders == renders + 1


def test_a_groups_sessions_render_their_prompt_once():
    tok = counting_renders(byte_tokenizer(QWEN3_LIKE))
    task = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix the bug"}]
    first = ConversationTokens(tok, task, template_kwargs={"enable_thinking": False})
    expected = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nfix the bug<|im_end|>\n" \
               "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.decode(first.token_ids) == expected and first.num_prompt_tokens == len(first.token_ids)
    renders = tok.renders
    others = [ConversationTokens(tok, [dict(m) for m in task], template_kwargs={"enable_thinking": False})
              for _ in range(7)]
    assert tok.renders == renders
    assert all(conv.token_ids == first.token_ids for conv in others)
    # Each conversation owns its ids: appending to one leaves the cached prompt and the others alone.
    others[0].add_generated([7], [0.0], version=0)
    assert tok.decode(others[1].token_ids) == expected
    # Another prompt, other arguments or another template are rendered anew.
    assert tok.decode(prompt_ids(tok, [{"role": "user", "content": "other"}])).startswith("<|im_start|>user\nother")
    assert tok.decode(prompt_ids(tok, task)).endswith("<|im_start|>assistant\n")
    tok.chat_template = CHATML
    assert tok.decode(prompt_ids(tok, task, template_kwargs={"enable_thinking": False})).endswith(
        "fix the bug<|im_end|>\n<|im_start|>assistant\n")
    assert tok.renders == renders + 3


def test_a_prompt_that_cannot_be_a_cache_key_is_rendered_each_time():
    tok = counting_renders(byte_tokenizer(CHATML))
    tools = [{"name": "bash"}]  # a list: not hashable
    ids = [prompt_ids(tok, [{"role": "user", "content": "q"}], template_kwargs={"tools": tools}) for _ in range(2)]
    assert ids[0] == ids[1] and tok.decode(ids[0]) == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    assert tok.renders == 2
