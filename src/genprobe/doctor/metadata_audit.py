"""The checks the GGUF and transformers audits share. The chat template read as code, never run: parsed with Jinja's
own parser and its syntax tree walked for injection attempts, template loads, dynamic lookups and content triggers
(docs/doctor.md, "Static audit": what each is, and why an attempt is named even though transformers' sandbox would
stop it). Special-token ids inside the vocabulary; hidden characters and URLs in every metadata string."""

from __future__ import annotations

import numbers
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable

from .options import Finding

# names whose presence in an attribute chain means the template reaches for the interpreter
GLOBALS = {"__globals__", "__builtins__", "__import__", "__loader__", "__spec__"}
HIERARCHY = {"__class__", "__mro__", "__subclasses__", "__base__", "__bases__"}
SYSTEM = {"os", "popen", "system", "subprocess", "sys", "eval", "exec", "importlib", "import_module", "builtins"}
# template globals and objects that hold a Python function (hence __globals__): the classic SSTI starting points
GADGETS = {"cycler", "joiner", "namespace", "lipsum", "range", "dict", "self", "config", "request", "raise_exception"}
REACHES = (  # what an unsafe chain reaches, by the first group its segments hit
    (GLOBALS, "reaches Python globals"),
    (HIERARCHY, "walks the class hierarchy"),
    (SYSTEM, "reaches the operating system"),
)
BIDI = {0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}  # "Trojan Source", CVE-2021-42574
_URL = re.compile(r"\b(?:https?|ftp|file)://[^\s'\"<>)]+", re.IGNORECASE)
_DUNDER = re.compile(r"^__\w+__$")
INJECTION_CRITERION = (
    "a chat template formats messages; one that walks attributes into Python internals (dunder names, os/subprocess) "
    "is an injection attempt, whether or not a sandbox stops it"
)


@dataclass
class TemplateAudit:
    """What the syntax tree holds: unsafe attribute chains, template loads, dynamic lookups, content triggers."""

    source: str
    chars: int
    syntax_error: str | None = None
    chains: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)
    dynamic: list[str] = field(default_factory=list)
    dunder_strings: list[str] = field(default_factory=list)
    content_triggers: list[str] = field(default_factory=list)
    content_tests: list[str] = field(default_factory=list)


def _environment() -> Any:
    """Jinja with what transformers' chat environment adds to the grammar (loop controls, ``{% generation %}``)."""
    from jinja2 import Environment, nodes
    from jinja2.ext import Extension

    class Generation(Extension):  # transformers' AssistantTracker tag: parsed, its body kept
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return Environment(extensions=["jinja2.ext.loopcontrols", Generation])


def _key(node: Any) -> str | None:
    """The attribute a Getattr / constant Getitem / ``|attr('x')`` node looks up (None for a computed key)."""
    from jinja2 import nodes

    if isinstance(node, nodes.Getattr):
        return str(node.attr)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
        return node.arg.value
    if isinstance(node, nodes.Filter) and node.name == "attr" and node.args and isinstance(node.args[0], nodes.Const):
        return str(node.args[0].value)
    return None


def _chain(node: Any) -> list[str]:
    """``cycler.__init__.__globals__.os.popen`` as its segments, root first (calls and filters looked through)."""
    from jinja2 import nodes

    if isinstance(node, nodes.Name):
        return [node.name]
    if isinstance(node, nodes.Const):
        return [repr(node.value)]
    if isinstance(node, nodes.Call):
        return _chain(node.node)
    key = _key(node)
    inner = getattr(node, "node", None)
    if inner is None:
        return ["…"]
    if key is None and isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        key = f"[{node.arg.value!r}]"
    return _chain(inner) + [key if key is not None else "[…]"]


def _within(node: Any, types: Any) -> list[Any]:
    """``node`` itself and its descendants of ``types`` (Jinja's ``find_all`` leaves the node out)."""
    return ([node] if isinstance(node, types) else []) + list(node.find_all(types))


def _mentions_content(node: Any) -> bool:
    from jinja2 import nodes

    return any(_key(n) == "content" for n in _within(node, (nodes.Getattr, nodes.Getitem)))


def analyse_template(text: str, source: str) -> TemplateAudit:
    """Parse ``text`` (never render it) and collect what :func:`template_findings` judges."""
    from jinja2 import TemplateSyntaxError, nodes

    audit = TemplateAudit(source, len(text))
    try:
        tree = _environment().parse(text)
    except TemplateSyntaxError as exc:
        audit.syntax_error = f"line {exc.lineno}: {exc.message}"
        return audit
    chains = {
        ".".join(_chain(n))
        for n in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter))
        if _key(n) is not None and any(_DUNDER.match(s) or s in SYSTEM for s in _chain(n))
    }
    chains |= {n.name for n in tree.find_all(nodes.Name) if n.name in SYSTEM | GLOBALS}
    audit.chains = sorted(c for c in chains if not any(o != c and o.startswith(c + ".") for o in chains))
    for n in tree.find_all((nodes.Import, nodes.FromImport, nodes.Include, nodes.Extends)):
        audit.loads.append(f"line {n.lineno}: {type(n).__name__.lower()}")
    for n in tree.find_all(nodes.Filter):
        if n.name == "attr" and _key(n) is None:
            audit.dynamic.append(f"line {n.lineno}: |attr() with a computed name")
    keys = {seg for c in audit.chains for seg in c.split(".")}  # a literal already named as a chain's key
    audit.dunder_strings = sorted(
        {c.value for c in tree.find_all(nodes.Const) if isinstance(c.value, str) and "__" in c.value} - keys
    )
    for test in [n.test for n in tree.find_all((nodes.If, nodes.CondExpr))]:  # if-tests on a message's content
        if not _mentions_content(test):
            continue
        literals = [c.value for c in _within(test, nodes.Const) if isinstance(c.value, str) and c.value]
        if literals and any(_mentions_content(c) for c in _within(test, nodes.Compare)):  # compared with a string
            audit.content_triggers.append(f"line {test.lineno}: content compared with {literals[0]!r}")
        elif any(_mentions_content(c) for c in _within(test, nodes.Call)):  # a method called on it
            audit.content_tests.append(f"line {test.lineno}: a method of the content decides a branch")
    return audit


def _gadget(chain: str) -> str:
    root, segments = chain.split(".", 1)[0], set(chain.split("."))
    reach = next((what for names, what in REACHES if segments & names), "touches Python internals")
    return f"{'gadget ' if root in GADGETS else ''}{root!r} {reach}"


def template_findings(audit: TemplateAudit, chat: bool) -> list[Finding]:
    """Injection attempts are bugs; template loads, dynamic lookups, dunder strings, content triggers and syntax
    errors are warnings (a syntax error is a bug when ``--chat`` sends the prompts through the template)."""
    ev: dict[str, Any] = {k: v for k, v in audit.__dict__.items() if v}
    where = f"the chat template ({audit.source})"
    out: list[Finding] = []
    if audit.syntax_error is not None:
        sev = "bug" if chat else "warning"
        title = f"{where} does not parse: {audit.syntax_error}; no engine can render it"
        return [Finding("audit", "template.syntax", sev, title, ev, "the template parses with Jinja's parser")]
    if audit.chains:
        names = "; ".join(f"{_gadget(c)} ({c})" for c in audit.chains[:3])
        title = f"injection attempt in {where}: {names}"
        out.append(Finding("audit", "template.injection", "bug", title, ev, INJECTION_CRITERION))
    risky = audit.loads + audit.dynamic + [f"string literal {s!r}" for s in audit.dunder_strings]
    if risky:
        title = f"{where} loads other templates or builds attribute names: {'; '.join(risky[:3])}"
        crit = "a self-contained template needs no import/include/extends, |attr() or dunder strings"
        out.append(Finding("audit", "template.risky", "warning", title, ev, crit))
    if audit.content_triggers:
        title = f"{where} branches on what a message says: {'; '.join(audit.content_triggers[:3])} (a trigger phrase)"
        crit = "a template's branches depend on roles and flags; one keyed to message text changes the prompt on cue"
        out.append(Finding("audit", "template.content_trigger", "warning", title, ev, crit))
    elif audit.content_tests:
        title = f"{where} tests message content: {'; '.join(audit.content_tests[:3])}"
        out.append(Finding("audit", "template.content_test", "info", title, ev, "said, not judged"))
    if not out:
        title = f"{where}: {audit.chars} characters parsed, no unsafe construct"
        out.append(Finding("audit", "template.injection", "ok", title, ev, INJECTION_CRITERION))
    return out


# ---- metadata strings and special ids -----------------------------------------------------
def hidden_characters(text: str) -> list[str]:
    """The invisible characters of ``text`` (format, private-use and control characters but newline and tab) as
    ``U+XXXX NAME``, bidirectional controls first."""
    seen: dict[str, bool] = {}
    for ch in text:
        cat = unicodedata.category(ch)
        if ch not in "\n\r\t" and cat in ("Cf", "Co", "Cc"):
            seen.setdefault(f"U+{ord(ch):04X} {unicodedata.name(ch, cat)}", ord(ch) in BIDI)
    return sorted(seen, key=lambda k: not seen[k])


def text_fields(obj: Any, where: str = "") -> dict[str, str]:
    """Every string inside ``obj`` (dicts and lists walked) by where it sits (``config.json.a.b[0]``)."""
    if isinstance(obj, str):
        return {where: obj}
    if isinstance(obj, dict):
        items = [(f"{where}.{k}" if where else str(k), v) for k, v in obj.items()]
    elif isinstance(obj, list):
        items = [(f"{where}[{i}]", v) for i, v in enumerate(obj)]
    else:
        return {}
    return {k: text for w, v in items for k, text in text_fields(v, w).items()}


def metadata_findings(strings: dict[str, str]) -> list[Finding]:
    """Findings on the strings a model file carries but its vocabulary (where -> text; a vocabulary's tokens may
    legitimately be zero-width joiners and the like): hidden characters warn (bidi controls named), URLs are said."""
    hidden = {k: h for k, v in strings.items() if (h := hidden_characters(v))}
    urls = {k: u for k, v in strings.items() if (u := sorted(set(_URL.findall(v))))}
    out: list[Finding] = []
    crit = "metadata and templates are read by people and rendered into prompts: what they say must be what they show"
    if hidden:
        where, chars = next(iter(hidden.items()))
        bidi = any(ord(ch) in BIDI for k in hidden for ch in strings[k])
        kind = "bidirectional-control" if bidi else "invisible"
        title = f"{kind} characters in {len(hidden)} metadata field(s), e.g. {where}: {', '.join(chars[:3])}"
        out.append(Finding("audit", "metadata.hidden_text", "warning", title, {"fields": hidden}, crit))
    if urls:
        where, found = next(iter(urls.items()))
        title = f"URLs in {len(urls)} metadata field(s), e.g. {where}: {found[0]}"
        out.append(Finding("audit", "metadata.urls", "info", title, {"fields": urls}, "said, not judged: check them"))
    if not out:
        title = f"{len(strings)} metadata strings: no hidden characters, no URLs"
        out.append(Finding("audit", "metadata.hidden_text", "ok", title, {"fields": len(strings)}, crit))
    return out


def special_id_findings(
    check: str, ids: dict[str, Any], n: int | None, crit: str, harm: Callable[[dict], str] | None = None
) -> Finding:
    """Special-token ids (name -> an id or a list of ids) against an ``n``-token vocabulary: one outside it is a bug
    (``harm`` says what follows), none declared is not checked."""
    ev = {"ids": ids, "vocabulary": n}
    if n is None or not ids:
        return Finding("audit", check, "info", "special-token ids not checked: none declared", ev)
    flat = {k: v for k, vs in ids.items() for v in (vs if isinstance(vs, list) else [vs])}
    bad = {k: v for k, v in flat.items() if not (isinstance(v, numbers.Integral) and 0 <= int(v) < n)}
    if not bad:
        return Finding("audit", check, "ok", f"{len(ids)} special-token ids inside the {n}-token vocabulary", ev, crit)
    names = ", ".join(f"{k} = {v}" for k, v in bad.items())
    title = f"special-token id(s) outside the {n}-token vocabulary: {names}{f' ({harm(bad)})' if harm else ''}"
    return Finding("audit", check, "bug", title, ev, crit)
