"""Renders a chat template with Python's jinja2 the way transformers' apply_chat_template does
(sandboxed environment, trim_blocks, lstrip_blocks, its tojson, raise_exception), for
scripts/gen-tokenizer-fixtures.ts to check @huggingface/jinja against. stdin: {template,
contexts: [...]}; stdout: [text, ...]."""
import json
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise ValueError(message)


req = json.load(sys.stdin)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
template = env.from_string(req["template"])
json.dump([template.render(**ctx) for ctx in req["contexts"]], sys.stdout, ensure_ascii=False)
