"""The README and docs/configuration.md say what the code does.

The README's commands are its fenced ``sh`` blocks (one command a line, ``\\`` continues
a line, ``#`` starts a comment); its ``yaml`` blocks are manifests a reader applies; a
``text`` block right after an ``sh`` block is what that block's last command prints.
``tests/integration/test_readme.py`` runs every command and applies every manifest, in
README order, against a real plane, except the few in ``ELSEWHERE``, which say which
other test or CI step runs them. The test here fails when the README gains a command
that neither covers.

docs/configuration.md lists every flag of every ``cellplane`` command (checked against
the argparse parsers, both ways), every ``CELLPLANE_*`` environment variable the code
reads, and the fields of the CRDs. Its CRD section is generated from ``crds/*.yaml``:
``.venv/bin/python tests/unit/test_readme.py`` rewrites it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from schemawalk import unknown_fields
from cellplane_operator.api.base import DNS_SUBDOMAIN_PATTERN, QUANTITY_PATTERN

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CONFIGURATION = REPO / "docs" / "configuration.md"


@dataclass(frozen=True)
class Elsewhere:
    """Where a README command that test_readme.py does not run is exercised."""

    path: str
    """The test or CI script that runs it, from the repository root."""
    runs: str
    """What that file runs, as written there (checked to be in it)."""
    why: str


ELSEWHERE: dict[str, Elsewhere] = {
    "bash hack/demo.sh": Elsewhere(
        "tests/integration/test_demo.py", '"bash", "hack/demo.sh", "--short", "--json"',
        "the same script and demo with a shorter load, its invariants asserted from the "
        "JSON summary; the full demo takes minutes and its table is for people"),
    "bash hack/test.sh": Elsewhere(
        ".ci/run", "exec bash hack/test.sh",
        "CI runs exactly this on a fresh clone; a test cannot run the suite it is part of"),
    'bash hack/test.sh -m "not integration"': Elsewhere(
        ".ci/run", "exec bash hack/test.sh",
        "the same script as CI's; this only passes pytest a marker"),
}
"""README commands that tests/integration/test_readme.py does not run itself."""

RUN_BY_TEST_README = ("kubectl ", "export ")
"""What tests/integration/test_readme.py runs: kubectl (and the plugin through it), and
``export`` lines, whose environment it keeps for the commands after them."""


# ------------------------------------------------------------------ README blocks


@dataclass(frozen=True)
class Command:
    line: str
    """The command as written, its trailing comment included."""
    expected: str | None = None
    """The output the README shows for it (a ``text`` block after its ``sh`` block)."""

    @property
    def bare(self) -> str:
        """Without its trailing comment."""
        return re.sub(r"\s+#\s.*$", "", self.line).strip()


@dataclass(frozen=True)
class Manifest:
    text: str
    """A ``yaml`` block, to be applied verbatim."""


Step = Command | Manifest

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)


def fenced_blocks(markdown: str) -> Iterator[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    for match in FENCE.finditer(markdown):
        yield match.group(1), match.group(2)


def commands_of(block: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", "", block)
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def readme_steps(markdown: str) -> list[Step]:
    """The README's commands and manifests in order; a ``text`` block directly after an
    ``sh`` block is the expected output of that block's last command."""
    steps: list[Step] = []
    blocks = list(FENCE.finditer(markdown))
    for index, block in enumerate(blocks):
        language, body = block.group(1), block.group(2)
        if language == "sh":
            lines = commands_of(body)
            assert lines, f"an empty sh block at offset {block.start()}"
            expected = None
            following = blocks[index + 1] if index + 1 < len(blocks) else None
            if (following is not None and following.group(1) == "text"
                    and not markdown[block.end():following.start()].strip()):
                expected = following.group(2)
            steps += [Command(line) for line in lines[:-1]]
            steps.append(Command(lines[-1], expected))
        elif language == "yaml":
            steps.append(Manifest(body))
    return steps


def readme_commands() -> list[Command]:
    return [s for s in readme_steps(README.read_text()) if isinstance(s, Command)]


def test_every_readme_command_is_run_by_a_test_or_by_ci() -> None:
    commands = readme_commands()
    assert commands
    unexercised = [c.line for c in commands
                   if c.bare not in ELSEWHERE and not c.bare.startswith(RUN_BY_TEST_README)]
    assert not unexercised, (
        "README commands that tests/integration/test_readme.py does not run: run them "
        f"there, or add them to ELSEWHERE with where they are exercised: {unexercised}")


def test_the_allow_list_names_only_commands_the_readme_has_and_where_they_run() -> None:
    bare = {c.bare for c in readme_commands()}
    assert set(ELSEWHERE) <= bare, set(ELSEWHERE) - bare
    for command, where in ELSEWHERE.items():
        assert where.runs in (REPO / where.path).read_text(), (
            f"{where.path} no longer runs {where.runs!r}, which exercised `{command}`")


def test_the_quick_start_is_exactly_the_two_commands() -> None:
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    first = next(body for language, body in fenced_blocks(section) if language == "sh")
    assert [re.sub(r"\s+#\s.*$", "", c) for c in commands_of(first)] == [
        "bash hack/demo.sh", "bash hack/test.sh"]


def test_the_readme_manifests_parse_and_follow_the_crds() -> None:
    manifests = [s for s in readme_steps(README.read_text()) if isinstance(s, Manifest)]
    kinds = [doc["kind"] for m in manifests for doc in yaml.safe_load_all(m.text)]
    assert "Cell" in kinds and "Tenant" in kinds
    from cellplane_operator.api.v1alpha1 import CellSpec, TenantSpec

    for manifest in manifests:
        for doc in yaml.safe_load_all(manifest.text):
            # The operator's own parse: field names and bounds as the code knows them.
            if doc["kind"] == "Cell":
                CellSpec.model_validate(doc["spec"])
            else:
                TenantSpec.model_validate(doc["spec"])
            # ... which ignores unknown names; the CRD's schema knows every one.
            crd = yaml.safe_load((REPO / "crds" / f"cellplane.io_{doc['kind'].lower()}s.yaml")
                                 .read_text())
            schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            assert not list(unknown_fields(doc["spec"], schema, "spec")), doc


def test_command_parsing_joins_continuations_and_pairs_output() -> None:
    text = ("```sh\n# a comment\nkubectl get \\\n    cells   # all\nkubectl version\n```\n\n"
            "```text\nok\n```\n\n```yaml\nkind: Cell\n```\n")
    assert readme_steps(text) == [Command("kubectl get cells   # all"),
                                  Command("kubectl version", "ok\n"), Manifest("kind: Cell\n")]
    assert Command("kubectl get cells   # all").bare == "kubectl get cells"


# ------------------------------------------------------------ configuration.md


def _sections(markdown: str) -> dict[str, str]:
    """Heading text -> the text under it, up to the next heading of any level."""
    prose = re.sub(r"^```.*?^```\s*$", "", markdown, flags=re.M | re.S)
    parts = re.split(r"^(#{1,6} .*)$", prose, flags=re.M)
    return {parts[i].lstrip("#").strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _commands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}")


def _documented_options(parser: argparse.ArgumentParser) -> set[str]:
    return {next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
            for action in parser._actions
            if action.option_strings and action.help != argparse.SUPPRESS
            and not isinstance(action, argparse._HelpAction)}


def _cellplane_commands() -> dict[str, argparse.ArgumentParser]:
    from cellplane_operator.commands.main import _parser

    return {path: parser for path, parser in _commands(_parser(), "cellplane")
            if _documented_options(parser) or not any(
                isinstance(a, argparse._SubParsersAction) for a in parser._actions)}


def _section_of(sections: dict[str, str], command: str) -> str:
    found = [text for heading, text in sections.items() if f"`{command}`" in heading]
    assert len(found) == 1, f"docs/configuration.md needs one heading with `{command}`"
    return found[0]


def _table_flags(section: str) -> set[str]:
    return {match.group(1) for match in re.finditer(r"^\| `(-[-\w]+)`", section, re.M)}


def test_every_flag_of_every_command_is_documented_and_nothing_else() -> None:
    sections = _sections(CONFIGURATION.read_text())
    missing: dict[str, set[str]] = {}
    stale: dict[str, set[str]] = {}
    for path, parser in _cellplane_commands().items():
        if path == "cellplane":
            continue
        documented = _table_flags(_section_of(sections, path))
        real = _documented_options(parser)
        if real - documented:
            missing[path] = real - documented
        if documented - real:
            stale[path] = documented - real
    assert not missing, f"flags missing from docs/configuration.md: {missing}"
    assert not stale, f"docs/configuration.md lists flags the parsers do not have: {stale}"


ENV_ROW = re.compile(r"^\| `(--[-\w]+)` \| `(CELLPLANE_\w+)`", re.M)


def test_each_documented_variable_sets_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    sections = _sections(CONFIGURATION.read_text())
    checked = 0
    for path in _cellplane_commands():
        if path == "cellplane":
            continue
        for flag, variable in ENV_ROW.findall(_section_of(sections, path)):
            if _action(_cellplane_commands()[path], flag) is None:
                continue  # a stale row: the test above names it
            monkeypatch.delenv(variable, raising=False)
            before = _flag_default(_cellplane_commands()[path], flag)
            monkeypatch.setenv(variable, "true" if isinstance(before, bool) else "7")
            after = _flag_default(_cellplane_commands()[path], flag)
            monkeypatch.delenv(variable)
            assert after != before, f"{variable} does not change {path} {flag}"
            checked += 1
    assert checked >= 5


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


def _flag_default(parser: argparse.ArgumentParser, flag: str) -> Any:
    action = _action(parser, flag)
    assert action is not None, flag
    return action.default


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    text = CONFIGURATION.read_text()
    sources = [*REPO.glob("operator/cellplane_operator/**/*.py"),
               *REPO.glob("cells/cellplane_cells/**/*.py"), *REPO.glob("hack/*.sh")]
    names: set[str] = set()
    for source in sources:
        body = source.read_text()
        names |= set(re.findall(r"\b(CELLPLANE_[A-Z][A-Z0-9_]*[A-Z0-9])\b", body))
        # cells/settings.py reads CELLPLANE_CELL_<NAME> through _env("NAME")
        if source.name == "settings.py" and "CELLPLANE_CELL_" in body:
            names |= {f"CELLPLANE_CELL_{n}" for n in re.findall(r'_env\("(\w+)"', body)}
    names.discard("CELLPLANE_CELL")
    assert names
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"environment variables missing from docs/configuration.md: {missing}"


# ---------------------------------------------------------- the CRD field tables

BEGIN = "<!-- crd-fields: generated by tests/unit/test_readme.py from crds/*.yaml; do not edit -->"
END = "<!-- crd-fields: end -->"


def _bounds(schema: dict[str, Any]) -> str:
    parts: list[str] = []
    if "enum" in schema:
        parts.append(" \\| ".join(f"`{v}`" for v in schema["enum"]))
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None or high is not None:
        left = "" if low is None else (f"> {low:g}" if schema.get("exclusiveMinimum")
                                       else f">= {low:g}")
        right = "" if high is None else f"<= {high:g}"
        parts.append(", ".join(p for p in (left, right) if p))
    if "maxItems" in schema:
        parts.append(f"at most {schema['maxItems']} items")
    # Named patterns: a regular expression's brackets and bars would break the table.
    named = {"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$": "a DNS label",
             DNS_SUBDOMAIN_PATTERN: "a DNS subdomain",
             QUANTITY_PATTERN: "a quantity such as `500m` or `1Gi`"}
    if schema.get("pattern") in named:
        parts.append(named[schema["pattern"]])
    elif "pattern" in schema:
        parts.append(f"matches `{schema['pattern']}`")
    if "maxLength" in schema and schema.get("pattern") != "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$":
        parts.append(f"at most {schema['maxLength']} characters")
    for rule in schema.get("x-kubernetes-validations", ()):
        if rule["rule"] == "self == oldSelf":
            parts.append("immutable")
    return "; ".join(parts)


def _default(schema: dict[str, Any]) -> str:
    if "default" not in schema:
        return ""
    value = schema["default"]
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def _rows(schema: dict[str, Any], prefix: str, required: set[str]) -> Iterator[str]:
    for name, field in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        kind = field.get("type", "")
        if kind == "array":
            kind = f"[]{field.get('items', {}).get('type', '')}"
        description = " ".join(field.get("description", "").split()).replace("|", "\\|")
        mark = " (required)" if name in required else ""
        yield (f"| `{path}`{mark} | {kind} | {_default(field)} | {_bounds(field)} | "
               f"{description} |")
        if field.get("type") == "object":
            yield from _rows(field, path, set(field.get("required", ())))
        elif field.get("type") == "array" and field.get("items", {}).get("type") == "object":
            items = field["items"]
            yield from _rows(items, f"{path}[]", set(items.get("required", ())))


def _cross_field_rules(schema: dict[str, Any], prefix: str = "spec") -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", ()):
        if rule["rule"] != "self == oldSelf":
            yield f"- `{prefix}`: {rule['message']}"
    for name, field in schema.get("properties", {}).items():
        if field.get("type") == "object":
            yield from _cross_field_rules(field, f"{prefix}.{name}")


def crd_reference() -> str:
    out = [BEGIN]
    for kind in ("cells", "tenants", "tenantmoves"):
        crd = yaml.safe_load((REPO / "crds" / f"cellplane.io_{kind}.yaml").read_text())
        names = crd["spec"]["names"]
        version = crd["spec"]["versions"][0]
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        scope = "cluster-scoped" if crd["spec"]["scope"] == "Cluster" else "namespaced"
        out += ["", f"### {names['kind']} (`{crd['spec']['group']}/{version['name']}`, {scope}, "
                    f"short name `{names['shortNames'][0]}`)", "",
                " ".join(spec.get("description", "").split()), "",
                "| field | type | default | allowed | what |", "|---|---|---|---|---|",
                *_rows(spec, "", set(spec.get("required", ())))]
        rules = list(_cross_field_rules(spec))
        if rules:
            out += ["", "Rules across fields (CEL, checked by the apiserver):", "", *rules]
    out += ["", END]
    return "\n".join(out)


def _generated_part(text: str) -> str:
    assert BEGIN in text and END in text, "docs/configuration.md lost its generated CRD markers"
    return BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END


def test_the_crd_field_tables_match_the_crds() -> None:
    assert _generated_part(CONFIGURATION.read_text()) == crd_reference(), (
        "docs/configuration.md is stale: run .venv/bin/python tests/unit/test_readme.py")


def _rewrite() -> None:
    text = CONFIGURATION.read_text()
    CONFIGURATION.write_text(text.replace(_generated_part(text), crd_reference()))
    print(f"rewrote the CRD tables of {CONFIGURATION.relative_to(REPO)}")


if __name__ == "__main__":
    _rewrite()


# ------------------------------------------------------------------------ links

DOCS = (README, CONFIGURATION, REPO / "docs" / "concepts.md")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    broken: list[str] = []
    prose = re.sub(r"^```.*?^```\s*$", "", page.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
            continue
        if anchor:
            text = re.sub(r"^```.*?^```\s*$", "", linked.read_text(), flags=re.M | re.S)
            anchors = {_anchor(h) for h in re.findall(r"^#{1,6} (.*)$", text, re.M)}
            if anchor not in anchors:
                broken.append(target)
    assert not broken, f"{page.name}: links that lead nowhere: {broken}"
