"""The documentation's reference, generated from the code (docs/_ext/pgjobs_reference):
every setting, command option, check id, signal, exception and state appears, and a
docstring that disagrees with the code stops the build instead of misleading a reader."""

from __future__ import annotations

import argparse
import html
import io
import re
import textwrap
import warnings
from pathlib import Path

import pytest
from django.core.management import load_command_class
from hypothesis import given
from hypothesis import strategies as st

from django_pgjobs import __version__, exceptions, signals
from django_pgjobs.states import JobState
from tests.docs import DOCS_EXTENSIONS, docs_reference
from tests.spawn import ROOT

markdown = docs_reference("markdown")


def test_the_checks_reference_names_every_check_id_of_the_source() -> None:
    source = "\n".join(
        path.read_text()
        for path in (ROOT / "django_pgjobs").rglob("*.py")
        if "migrations" not in path.parts
    )
    ids = set(re.findall(r"""id=["'](pgjobs\.[A-Z]\d+)["']""", source))
    page = docs_reference("checks").checks_markdown()
    assert ids and {check_id for check_id in ids if f"## {check_id}\n" not in page} == set()


def test_the_checks_reference_says_which_checks_run_with_deploy() -> None:
    entries = docs_reference("checks").check_entries()
    deploy = {entry.id for entry in entries if entry.deploy}
    assert {"pgjobs.W010", "pgjobs.W011", "pgjobs.W012"} <= deploy
    assert "pgjobs.E001" not in deploy


@pytest.mark.parametrize(("name", "app"), docs_reference("commands").COMMANDS)
def test_the_commands_reference_lists_every_option_of_the_parser(name: str, app: str) -> None:
    page = docs_reference("commands").command_markdown(name, app)
    parser = load_command_class(app, name).create_parser("manage.py", name)
    parsers = [parser] + [
        subparser
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for subparser in action.choices.values()
    ]
    django_options = {"--version", "--verbosity", "--settings", "--pythonpath", "--traceback"}
    django_options |= {"--no-color", "--force-color", "--skip-checks", "--help"}
    for each in parsers:
        for action in each._actions:
            for option in action.option_strings:
                if option.startswith("--") and option not in django_options:
                    assert f"`{option}" in page, option


def test_the_commands_reference_holds_nested_subcommands_with_their_description() -> None:
    page = docs_reference("commands").command_markdown("jobsctl", "django_pgjobs")
    for name in ("schedules enable", "schedules disable", "schedules run"):
        assert f"### jobsctl {name}\n" in page, name
    assert "as the admin's Run now does" in page  # the description, not the one-line help


def test_the_signals_reference_holds_every_signal_with_the_arguments_it_is_sent_with() -> None:
    page = docs_reference("signals").signals_markdown()
    for name in ("job_enqueued", "job_started", "job_finished", "job_dead"):
        assert f"`django_pgjobs.signals.{name}`" in page
    sent = docs_reference("signals").sent_arguments()
    assert sent["job_started"] == {"handle"}
    assert sent["job_finished"] == {"handle", "outcome", "duration", "error"}


def test_a_signal_documented_with_other_arguments_than_it_is_sent_with_stops_the_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference = docs_reference("signals")
    wrong = (signals.__doc__ or "").replace(
        "`job_started(kind, handle)`", "`job_started(kind, handle, attempt)`"
    )
    assert wrong != signals.__doc__
    monkeypatch.setattr(signals, "__doc__", wrong)
    with pytest.raises(docs_reference("markdown").ReferenceDrift, match="job_started"):
        reference.signal_entries()


def test_the_exceptions_reference_names_every_exception_class() -> None:
    page = docs_reference("exceptions").exceptions_markdown()
    classes = [
        value
        for value in vars(exceptions).values()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == exceptions.__name__
    ]
    assert len(classes) > 10
    for cls in classes:
        assert f"`{cls.__name__}`" in page
    assert "`InvalidJobOption` (also a `ValueError`)" in page


def test_the_states_reference_says_what_moves_a_job_in_and_out_of_every_state() -> None:
    page = docs_reference("states").states_markdown()
    for state in JobState:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{state.value}`"))
        assert "In:" in row and "Out:" in row, state


@given(st.text())
def test_a_table_cell_is_one_line_whatever_text_a_docstring_holds(text: str) -> None:
    cell = markdown.cell(text)
    assert "\n" not in cell and "\r" not in cell
    assert re.search(r"(?<!\\)\|", cell) is None
    assert cell.replace("\\|", "|") == " ".join(text.split())


@given(st.text(alphabet=st.sampled_from("`ab |*<>_\\")))
def test_a_code_span_holds_any_text_without_ending_early(text: str) -> None:
    """CommonMark ends a code span at the first run of backticks as long as its fence, and
    strips one space of padding on each side."""
    span = markdown.code(text)
    fence = re.match(r"`+", span).group(0)
    assert span.endswith(fence) and len(span) >= 2 * len(fence)
    inner = span[len(fence) : len(span) - len(fence)]
    assert all(len(run) != len(fence) for run in re.findall(r"`+", inner))
    padded = inner.startswith(" ") and inner.endswith(" ") and inner.strip(" ") != ""
    assert (inner[1:-1] if padded and inner != text else inner) == (text or " ")


def test_a_table_has_a_row_per_entry_and_its_header() -> None:
    rows = [("a|b", "line\nbreak"), ("`x`", "")]
    lines = markdown.table(("one", "two"), rows).splitlines()
    assert lines == ["| one | two |", "|---|---|", "| a\\|b | line break |", "| `x` |  |"]


def test_the_guarantees_page_counts_the_tests_that_pin_each_rule() -> None:
    """Every rule the guarantees page states is named by a test of the suite, the page
    states each once (S1 to S28 at least), and its table has a row per rule."""
    rules = docs_reference("rules")
    stated = sorted(rules.stated_rules())
    assert len(stated) == len(set(stated)) and set(range(1, 29)) | set(range(32, 37)) <= set(stated)
    pinned = rules.pinning_tests()
    assert [rule for rule in stated if rule not in pinned] == []
    page = rules.rules_markdown()
    assert [line.split(" | ")[0] for line in page.splitlines()[2:]] == [
        f"| S{rule}" for rule in stated
    ]
    assert "`test_s9_" in page


def test_the_admin_how_to_shows_what_jobsctl_prints_with_the_version_of_the_code() -> None:
    """The sample of `jobsctl status` is printed by the command's own code at build time:
    its columns line up and its version is the package's, whatever the release."""
    assert "```{pgjobs-jobsctl-workers}" in (ROOT / "docs" / "how-to" / "admin.md").read_text()
    lines = docs_reference("samples").jobsctl_workers_markdown().splitlines()
    assert (lines[0], lines[-1]) == ("```text", "```")
    header, rule, row = lines[1:4]
    assert header.split()[:2] == ["worker", "state"] and header.endswith("version")
    assert row.split()[0] == "web-1:4242:9f3a2c" and row.endswith(f"  {__version__}")
    columns = [dashes.start() for dashes in re.finditer(r"-+", rule)]
    for line in (header, row):  # each cell starts where its column's dashes do
        assert [cell.start() for cell in re.finditer(r"(?:^|(?<=  ))\S", line)] == columns


def build_site(root: Path, pages: dict[str, str], extensions: list[str]) -> tuple[Path, str]:
    """Build a small Sphinx site of `pages` (docname: MyST text) with the docs' own
    extensions, as HTML; return the output folder and the warnings it printed."""
    testing = pytest.importorskip("sphinx.testing.util", reason="needs the docs extra")
    pytest.importorskip("myst_parser", reason="needs the docs extra")
    source = root / "source"
    for docname, text in pages.items():
        (source / f"{docname}.md").parent.mkdir(parents=True, exist_ok=True)
        (source / f"{docname}.md").write_text(textwrap.dedent(text))
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(DOCS_EXTENSIONS)!r})\n"
        f"extensions = {['myst_parser', *extensions]!r}\n"
        "pgjobs_implementation_signatures = ['django_pgjobs.decorators.job']\n"
    )
    printed = io.StringIO()
    with warnings.catch_warnings():
        # Sphinx's notices of its own coming API changes, which myst-parser and napoleon
        # still meet: not the docs' to fix.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        app = testing.SphinxTestApp(
            "html", srcdir=source, builddir=root / "build", freshenv=True, warning=printed
        )
        try:
            app.build()
        finally:
            app.cleanup()  # the nodes and directives Sphinx registers in docutils
    return root / "build" / "html", re.sub(r"\x1b\[[0-9;]*m", "", printed.getvalue())


def html_text(markup: str) -> str:
    """Return the text of an HTML fragment: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


RULES_PAGE = """\
    # The guarantees

    - **S1** An enqueue is one `INSERT`.
    - **S2** Options are decided once, at enqueue, after S1.
    """


def test_a_rule_number_in_prose_links_to_its_rule_on_the_guarantees_page(tmp_path: Path) -> None:
    """A rule number on any page becomes a link to its rule's anchor on the guarantees
    page, each end of a range too, and so does a link to the page that reads one; code,
    the rule's own bold number and a link of other text are left alone. (No rule number
    in this docstring: it would count as a test that pins the rule.)"""
    index = """\
        # Home

        Options resolve once (S2); both ends of S1\N{EN DASH}S2 link, and so does
        [S1](explanation/guarantees.md#the-guarantees), to the rule itself.
        `S2` in code is code, and [the page](explanation/guarantees.md) a link to it.

        ```python
        S2 = "in a code block"
        ```

        ```{toctree}
        explanation/guarantees
        ```
        """
    site, printed = build_site(
        tmp_path,
        {"index": index, "explanation/guarantees": RULES_PAGE},
        ["pgjobs_rule_links"],
    )
    assert printed == ""
    home = (site / "index.html").read_text()
    prose = home[: home.index('<div class="toctree-wrapper')]
    links = re.findall(r'<a class="reference internal" href="([^"]+)">(.*?)</a>', prose)
    to_rules = [(href, html_text(text)) for href, text in links]
    assert to_rules == [
        ("explanation/guarantees.html#s2", "S2"),
        ("explanation/guarantees.html#s1", "S1"),
        ("explanation/guarantees.html#s2", "S2"),
        ("explanation/guarantees.html#s1", "S1"),
        ("explanation/guarantees.html", "the page"),
    ]
    assert '<span class="pre">S2</span></code>' in home
    assert 'S2</span> <span class="o">=</span>' in home  # the code block, unlinked
    rules = (site / "explanation" / "guarantees.html").read_text()
    assert '<li id="s1"><p><strong>S1</strong> An enqueue' in rules
    assert '<li id="s2"><p><strong>S2</strong> Options' in rules
    assert re.search(r'after <a class="reference internal" href="#s1">.*?S1.*?</a>\.', rules)


def test_a_rule_number_the_guarantees_page_does_not_state_is_a_warning(tmp_path: Path) -> None:
    index = (
        "# Home\n\nA rule that is not there (S99).\n\n```{toctree}\nexplanation/guarantees\n```\n"
    )
    site, printed = build_site(
        tmp_path,
        {"index": index, "explanation/guarantees": RULES_PAGE},
        ["pgjobs_rule_links"],
    )
    assert "index.md:3: WARNING: S99 is not a rule the guarantees page states" in printed
    assert "S99" in (site / "index.html").read_text()


def test_the_api_reference_shows_the_job_decorator_with_one_signature(tmp_path: Path) -> None:
    """`@job`'s overloads are for type checkers: the page shows the implementation's
    signature once, with every option, under the name users import."""
    page = "# API\n\n```{eval-rst}\n.. autodecorator:: django_pgjobs.job\n```\n"
    site, printed = build_site(
        tmp_path,
        {"index": page},
        ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "pgjobs_reference.directives"],
    )
    assert printed == ""
    api = (site / "index.html").read_text()
    signatures = re.findall(r'<dt class="sig sig-object py"[^>]*>(.*?)</dt>', api, re.S)
    assert len(signatures) == 1
    text = " ".join(html_text(signatures[0]).split())
    assert text.startswith("@django_pgjobs.job(func:")
    for option in ("queue", "max_attempts", "result_retention", "concurrency_key", "rate"):
        assert f" {option}:" in text
