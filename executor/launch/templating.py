"""The Jinja2 environment of the bundle's text files (the templates/ folder beside this module).

Scripts, READMEs and the comments around the manifests are template files; every value reaches them
already validated or quoted for its place (`LaunchContext`, quoting.py), so nothing is escaped here.
The manifests themselves are data, dumped by `yaml_documents`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from executor.launch.quoting import python_literal, sh

TEMPLATES_DIR = Path(__file__).parent / "templates"


@cache
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=False,  # bash, YAML comments and Markdown: values are quoted for their place already
        undefined=jinja2.StrictUndefined,  # a misspelt variable fails the tests instead of rendering empty
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        # Bash's `${#array[@]}` would open a Jinja comment with the default `{#`.
        comment_start_string="{##",
        comment_end_string="##}",
    )
    environment.filters["sh"] = sh
    environment.filters["py"] = python_literal  # generated Python modules: data as literals, never code
    environment.filters["thousands"] = "{:,}".format
    environment.filters["yaml"] = yaml_document
    return environment


def render_template(name: str, /, **values: Any) -> str:
    """The template `name` (a file in templates/) rendered with `values`."""
    return _environment().get_template(name).render(**values)


class _Dumper(yaml.SafeDumper):
    """Block-style YAML as Kubernetes' own examples write it: lists indented under their key, and no
    anchors (two replicas with equal pod templates are written out twice, as kubectl expects)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True


class Script(str):
    """A multi-line script inside a YAML document (a SkyPilot task's setup and run): dumped as a literal
    block (`|`), so the file shows it line by line as a person would write it."""


def _literal_block(dumper: yaml.SafeDumper, data: Script) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


_Dumper.add_representer(Script, _literal_block)


def yaml_document(document: dict[str, Any]) -> str:
    """One YAML document (without the `---` that separates it from the next), keys in their order."""
    return yaml.dump(
        document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=2**16, allow_unicode=False
    )
