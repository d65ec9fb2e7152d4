"""A user's harness, written against docs/agents.md only: the official `openai` client, one `bash` tool,
several turns. It imports nothing of rl360 (tests/agent/test_user_harness.py checks that).

The model may call the tool, or (a small model that never learned tool calls) put its command in a ```bash
block: this harness, like many, runs either; a reply with neither ends it.
"""

import json
import re

import openai

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a bash command and see its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
FENCE = re.compile(r"```bash\n(.*?)\n```", re.DOTALL)


def run(session, max_turns: int = 4) -> None:
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    messages = [{"role": "user", "content": session.task.instruction}]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=session.model, messages=messages, tools=[BASH],
                                               max_tokens=48, temperature=1.0).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if reply.tool_calls:
            for call in reply.tool_calls:
                command = json.loads(call.function.arguments).get("command", "")
                result = session.sandbox.exec(command, timeout_s=30)
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": f"[exit code {result.exit_code}]\n{result.output}".rstrip()})
            continue
        block = FENCE.search(reply.content or "")
        if block is None:
            return
        result = session.sandbox.exec(block.group(1), timeout_s=30)
        messages.append({"role": "tool", "content": f"[exit code {result.exit_code}]\n{result.output}".rstrip()})
