#!/usr/bin/env python3
"""Differential check of `tandem template render` against Jinja2 (Debian: apt-get install python3-jinja2).

Renders each template below with Jinja2, set up as the model hub's renderer (immutable sandbox, trim_blocks,
lstrip_blocks, loop controls, json.dumps tojson), and with tandem, and reports every difference. A render error
only has to be an error on both sides. Not part of ctest: the build does not install Jinja2.

usage: tests/jinja_differential.py build/tandem
"""
import json
import os
import subprocess
import sys
import tempfile

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

VARS = {
    "messages": [{"role": "user", "content": "Hi \u00e9 \u00fc\n"}, {"role": "assistant", "content": None}],
    "x": 3,
    "f": 2.5,
    "d": {"b": 1, "a": [1, 2.0, None, True, "q'\"\\"]},
    "s": "  Hello World  ",
}

TEMPLATES = [
    "{{ f }}|{{ 1/3 }}|{{ 10/2 }}|{{ 7//2 }}|{{ -7//2 }}|{{ -7 % 3 }}|{{ 2**10 }}|{{ 1e20 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 1e16 }}|{{ 123456789012345678.0 }}",
    "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ d }}|{{ messages }}",
    "{{ s|trim }}|{{ s.strip() }}|{{ s.split() }}|{{ s.split(' ') }}|{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ s|capitalize }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s|length }}",
    "{{ \"abcdef\"[1:4] }}|{{ \"abcdef\"[::-1] }}|{{ \"abcdef\"[-2:] }}|{{ [1,2,3,4][1::2] }}|{{ \"héllo\"[1] }}|{{ \"héllo\"|length }}|{{ \"a,b,,c\".split(\",\") }}|{{ \"a b c\".split(None, 1) }}|{{ \"a-b-c\".rsplit(\"-\", 1) }}",
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ loop.first }} {{ loop.last }} {{ loop.revindex }} {{ m.role }} {{ loop.previtem.role if loop.previtem }}{{ loop.cycle('odd','even') }}\n{% endfor %}",
    "{% macro greet(name, punct=\"!\") %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet(\"a\") }} {{ greet(\"b\", punct=\"?\") }} {{ greet(name=\"c\") }}",
    "  {% if x > 2 %}\n    big\n  {% else %}\n    small\n  {% endif %}\n  {{- \" after\" }}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{{ [3,1,2]|sort }}|{{ [3,1,2]|sort(reverse=true) }}|{{ [\"b\",\"A\",\"a\"]|unique|list }}|{{ [1,2,3]|join(\"-\") }}|{{ [1,2,3]|sum }}|{{ [1,2,3]|first }}|{{ [1,2,3]|last }}|{{ [1,2,3]|max }}|{{ [1,2,3]|min }}|{{ [1,2,3]|reverse|list }}",
    "{{ messages|map(attribute=\"role\")|join(\",\") }}|{{ messages|selectattr(\"role\",\"equalto\",\"user\")|list|length }}|{{ messages|rejectattr(\"content\")|list }}|{{ d|items|list }}|{{ d|dictsort }}",
    "{{ \"x\" ~ 1 ~ none ~ true }}|{{ \"%s\" if x else \"no\" }}|{{ none }}|{{ true and \"yes\" }}|{{ 0 or \"fallback\" }}|{{ undefined_var|default(\"dflt\") }}|{{ \"\"|default(\"e\", true) }}",
    "{{ \"ab\\ncd\\n\\nef\"|indent(2) }}|{{ \"ab\\ncd\"|indent(2, first=true) }}|{{ \"ab\\n\\ncd\"|indent(2, blank=true) }}",
    "{{ x is defined }}{{ y is defined }}{{ x is number }}{{ x is integer }}{{ f is float }}{{ s is string }}{{ d is mapping }}{{ d.a is iterable }}{{ x is even }}{{ x is odd }}{{ x is divisibleby 3 }}{{ none is none }}{{ true is boolean }}",
    "{%- set ns = namespace(count=0, items=[]) -%}\n{%- for m in messages -%}{%- set ns.count = ns.count + 1 -%}{%- set ns.items = ns.items + [m.role] -%}{%- endfor -%}\n{{ ns.count }} {{ ns.items }}",
    "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t %}captured {{ x }}{% endset %}[{{ t }}]{% filter upper %}shout {{ s }}{% endfilter %}",
    "{{ \"Hello\"|replace(\"l\", \"L\") }}|{{ \"Hello\".replace(\"l\", \"L\", 1) }}|{{ \"hello\".startswith(\"he\") }}|{{ \"hello\".endswith((\"lo\", \"x\")) }}|{{ \"a b\".title() }}|{{ \"abc\".find(\"c\") }}|{{ \"aXbXc\".count(\"X\") }}|{{ \", \".join([\"a\", \"b\"]) }}",
    "{# comment #}\n  {#- stripped comment -#}\ntext {{ x }}   \n{%- if true %}\n yes\n{%+ if true %}keep{% endif %}\n{% endif %}",
    "{{ messages[0].content|tojson }}|{{ messages[1].content|tojson }}|{{ \"é\\u2028\\x01\"|tojson }}|{{ \"é\"|tojson(ensure_ascii=true) }}",
    "{{ messages[0]['content'] + 1 }}",
    "{{ none + \"x\" }}",
    "{{ undefinedthing.attr }}",
    "{{ x|int + \"3\"|int + \"4.5\"|int + 2.7|int }}|{{ \"3.5\"|float }}|{{ 3|float }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ -3|abs }}|{{ 2.567|round(2) }}",
    "{{ 'It''s' }} {{ \"tab\\there\" }} {{ 'q\"uote' }} {{ ['it\\'s', \"a\\\"b\"] }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% else %}empty{% endfor %}{% for x in [] %}no{% else %}was empty{% endfor %}",
    "{% for m in messages if m.role == \"assistant\" %}{{ loop.index }}{{ m.role }}{{ loop.length }}{% endfor %}",
    "{{ [1, 2] + [3] }}|{{ \"ab\" * 3 }}|{{ [0] * 3 }}|{{ 1 in [1, 2] }}|{{ \"b\" in \"abc\" }}|{{ \"a\" in d }}|{{ \"z\" not in d }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}\n",
    "{% for a in [1,2] %}{% for b in \"xy\" %}{{ loop.index }}{{ a }}{{ b }}{% endfor %}{{ loop.index }}{% endfor %}",
    "\t{% if true %}\n\ttabbed\n\t{% endif %}\n    {{ x }}\n  {# c #}\nend",
    "{%- for m in messages -%}\n  {{- m.role -}}\n  {%- if not loop.last -%}, {% endif -%}\n{%- endfor -%}",
    "{{ [1,2,3,4,5,6]|select(\"divisibleby\", 2)|list }}|{{ [1,2,3]|reject(\"odd\")|list }}|{{ [\"a\",\"b\"]|map(\"upper\")|list }}|{{ messages|selectattr(\"content\", \"defined\")|map(attribute=\"role\")|list }}|{{ messages|map(attribute=\"missing\", default=\"dflt\")|list }}",
    "{{ x is divisibleby(3) }}|{{ x is not none }}|{{ \"abc\" is lower }}|{{ x is sameas 3 }}|{{ 3 is in [1,3] }}|{{ x is gt 2 }}|{{ x is ge(4) }}",
    "{{ \"%d\"|length }}|{{ (1, 2) }}|{{ (1,) }}|{{ () }}|{{ {\"a\": 1}[\"a\"] }}|{{ {\"a\": {\"b\": 2}}.a.b }}|{{ [[1,2],[3]]|map(\"length\")|list }}",
    "{{ \"  x  \"|trim(\"x \") }}|{{ \"xxhixx\".strip(\"x\") }}|{{ \"a\\tb\\nc\".split() }}|{{ \"A B\".lower().split(\" \")|join(\"_\") }}|{{ \"abc\"|center(9) }}|{{ \"abc\".upper()[-1] }}",
    "{% set x = 5 %}{% if x %}{% set x = 6 %}{% endif %}{{ x }}{% for i in [1] %}{% set x = 7 %}{% endfor %}{{ x }}",
    "{% macro m() %}{{ x }}{% endmacro %}{% set x = 9 %}{{ m() }}",
    "{{ 1 if false }}|{{ \"a\" if x > 5 else \"b\" if x > 2 else \"c\" }}|{{ not x == 3 }}|{{ -x|abs }}|{{ - 2 ** 2 }}|{{ 2 ** 3 ** 2 }}|{{ 10 - 2 - 3 }}|{{ 2 * 3 ~ 4 }}|{{ 1 + 2 ~ 3 }}",
    "{{ messages[5] }}|{{ messages[5] is defined }}|{{ \"abc\"[10] is defined }}|{{ d[\"zz\"]|default(\"none\") }}|{{ (d.zz or \"or\") }}",
    "{% for i in range(3) %}{{ loop.cycle(\"a\", \"b\") }}{{ loop.revindex0 }}{{ loop.nextitem }}{% endfor %}|{{ range(2, 10, 3)|list }}|{{ range(5, 0, -2)|list }}",
    "{{ \"x\"|int }}|{{ \"0x1A\"|int(0, 16) }}|{{ \"12\"|int + 1 }}|{{ \"-5\"|int }}|{{ \" 7 \"|int }}|{{ true|int }}|{{ none|string }}|{{ [1]|string }}|{{ 1.0|string }}",
    "{%- set tools = [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}}}}] -%}\n{{ tools|tojson(indent=4) }}\n{% for t in tools %}{{ t.function.name }}{{ t.function.parameters.properties|items|list }}{% endfor %}",
    "{{ 'a' ~ undefinedvar ~ 'b' }}|{{ undefinedvar|trim }}|{{ undefinedvar|lower }}|{{ undefinedvar|join(\",\") }}|{{ undefinedvar|list }}|{{ 'x' in undefinedvar }}",
    "{{ messages|length > 1 and messages[0].role == \"user\" }}|{{ messages|last }}|{{ messages|first|attr(\"role\") if false else \"skip\" }}",
    "{% with y = x + 1, z = 2 %}{{ y }}{{ z }}{% endwith %}{{ y is defined }}",
    "{{ \"Hello World\"|wordcount }}|{{ \"hello world\"|title }}|{{ \"HELLO\"|capitalize }}|{{ [3, 1]|sort|first }}|{{ {\"b\": 1, \"a\": 2}|dictsort(by=\"value\") }}|{{ [\"B\", \"a\", \"C\"]|sort }}|{{ [\"B\", \"a\", \"C\"]|sort(case_sensitive=true) }}",
    "{{ \"<a href='x'>&</a>\"|e }}|{{ \"ok\"|safe }}|{{ 17|round }}|{{ 2.675|round(2) }}|{{ 5 / 2 }}|{{ 4 / 2 }}|{{ 7 % -3 }}|{{ 7.5 // 2 }}",
    "{{ \"a\" + 1 }}",
    "{{ 1 + \"a\" }}",
    "{{ [1] + \"a\" }}",
    "{{ messages.0.role }}{{ messages.1['role'] }}",
    "{%- if true -%}\n  a\n{%- endif -%}\n  b  {{- \"c\" -}}  d\n"
]


def hub_environment():
    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "07 Dec 2026"
    return env


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tandem = sys.argv[1]
    env = hub_environment()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.jinja")
        for source in TEMPLATES:
            try:
                want = env.from_string(source).render(**VARS)
            except Exception:  # any Jinja2 error: tandem must refuse too
                want = None
            with open(path, "w", encoding="utf-8") as f:
                f.write(source)
            p = subprocess.run([tandem, "template", "render", "--template", path, "--date", "2026-12-07"],
                               input=json.dumps(VARS) + "\n", capture_output=True, text=True)
            got = json.loads(p.stdout) if p.returncode == 0 else None
            if isinstance(got, dict):
                got = None
            if got != want:
                failures += 1
                print(f"--- {source!r}\n  jinja2: {want!r}\n  tandem: {got!r} {p.stderr.strip()}")
    print(f"{len(TEMPLATES) - failures} of {len(TEMPLATES)} templates render the same")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
