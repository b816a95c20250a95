"""The Sphinx extension: directives that write django_pgjobs' reference from its code.

Each directive renders the Markdown that one generator module returns, so the pages hold
no copy of a default, an option or an id that could fall behind the code:

    ```{pgjobs-settings}
    ```

The generators import no Sphinx, so the test suite checks their output too
(tests/unit/test_config.py: every setting appears with its default; tests/unit/test_docs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

from pgjobs_reference import (
    checks,
    commands,
    exceptions,
    rules,
    samples,
    settings,
    signals,
    states,
)

#: Directive name -> the generator of its Markdown.
GENERATORS: dict[str, Callable[[], str]] = {
    "pgjobs-settings": settings.settings_markdown,
    "pgjobs-task-options": settings.task_options_markdown,
    "pgjobs-commands": commands.commands_markdown,
    "pgjobs-checks": checks.checks_markdown,
    "pgjobs-signals": signals.signals_markdown,
    "pgjobs-exceptions": exceptions.exceptions_markdown,
    "pgjobs-states": states.states_markdown,
    "pgjobs-rules": rules.rules_markdown,
    "pgjobs-jobsctl-workers": samples.jobsctl_workers_markdown,
}


def generated_directive(generate: Callable[[], str]) -> type[SphinxDirective]:
    """Return a directive class that parses what `generate` returns in its place."""

    class GeneratedReference(SphinxDirective):
        has_content = False

        def run(self) -> list[nodes.Node]:
            container = nodes.container()
            text = generate()
            self.state.nested_parse(
                StringList(text.splitlines(), source=f"<{generate.__module__}>"),
                self.content_offset,
                container,
                match_titles=True,
            )
            return list(container.children)

    GeneratedReference.__name__ = f"Generated_{generate.__name__}"
    return GeneratedReference


def literal_examples(
    app: Sphinx, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    """Read a docstring's indented block after a paragraph as code, as the package writes
    its examples (`@job(schedule=Cron("0 3 * * *"))` is code, not reST emphasis).

    Section bodies (after `Args:`, `Returns:` ...) are indented without a blank line, so
    they are left alone for napoleon.
    """
    index = 2
    while index < len(lines):
        before, blank, block = lines[index - 2], lines[index - 1], lines[index]
        indent = len(before) - len(before.lstrip())
        if (
            before.strip()
            and not before.rstrip().endswith(":")
            and not blank.strip()
            and block.strip()
            and len(block) - len(block.lstrip()) > indent
        ):
            lines[index - 1 : index] = ["", " " * indent + "::", ""]
            index += 2
        index += 1


def implementation_signatures(app: Sphinx) -> None:
    """Document the functions that `pgjobs_implementation_signatures` names by their
    implementation's signature, not their `@overload`s.

    The overloads are for type checkers (`@job` bare, or `@job(...)` with options): autodoc
    would show one long signature per overload, and ignores a signature written in the
    directive while overloads exist. It reads them from the module's source analyzer,
    which Sphinx keeps once per module: forgetting them there leaves the implementation.
    """
    for dotted in app.config.pgjobs_implementation_signatures:
        module, _, qualname = dotted.rpartition(".")
        analyzer = ModuleAnalyzer.for_module(module)
        analyzer.analyze()
        if analyzer.overloads.pop(qualname, None) is None:
            raise ExtensionError(f"pgjobs_implementation_signatures: {dotted} has no overloads")


def setup(app: Sphinx) -> dict[str, Any]:
    for name, generate in GENERATORS.items():
        app.add_directive(name, generated_directive(generate))
    # Dotted paths of overloaded functions to document by their implementation's signature.
    app.add_config_value("pgjobs_implementation_signatures", [], "env", types=[list])
    app.connect("builder-inited", implementation_signatures)
    # Before napoleon (priority 500), which would otherwise see the examples as prose.
    app.connect("autodoc-process-docstring", literal_examples, priority=400)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
