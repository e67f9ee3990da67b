"""Metadata checks the GGUF and transformers audits share: special-token ids inside the vocabulary; hidden characters
("Trojan Source", CVE-2021-42574) and URLs in any string a model file carries but its vocabulary (whose tokens may
legitimately be zero-width joiners and the like)."""

from __future__ import annotations

import numbers
import re
import unicodedata
from typing import Any, Callable

from .findings import Finding

BIDI = {0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
_URL = re.compile(r"\b(?:https?|ftp|file)://[^\s'\"<>)]+", re.IGNORECASE)
_ALLOWED_CONTROLS = {"\n", "\r", "\t"}


def hidden_characters(text: str) -> list[str]:
    """The invisible characters of ``text`` (format, private-use and control characters but newline and tab) as
    ``U+XXXX NAME``, bidirectional controls first."""
    seen: dict[str, bool] = {}
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in _ALLOWED_CONTROLS or cat not in ("Cf", "Co", "Cc"):
            continue
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


def metadata_findings(strings: dict[str, str], command: str) -> list[Finding]:
    """Findings on ``strings`` (where -> text): hidden characters warn (bidi controls named), URLs are said."""
    hidden = {k: h for k, v in strings.items() if (h := hidden_characters(v))}
    urls = {k: u for k, v in strings.items() if (u := sorted(set(_URL.findall(v))))}
    out: list[Finding] = []
    crit = "metadata and templates are read by people and rendered into prompts: what they say must be what they show"
    if hidden:
        where, chars = next(iter(hidden.items()))
        bidi = any(ord(ch) in BIDI for k in hidden for ch in strings[k])
        kind = "bidirectional-control" if bidi else "invisible"
        title = f"{kind} characters in {len(hidden)} metadata field(s), e.g. {where}: {', '.join(chars[:3])}"
        out.append(Finding("audit", "metadata.hidden_text", "warning", title, {"fields": hidden}, crit, command))
    if urls:
        where, found = next(iter(urls.items()))
        title = f"URLs in {len(urls)} metadata field(s), e.g. {where}: {found[0]}"
        crit_urls = "said, not judged: check where they lead"
        out.append(Finding("audit", "metadata.urls", "info", title, {"fields": urls}, crit_urls, command))
    if not out:
        title = f"{len(strings)} metadata strings: no hidden characters, no URLs"
        out.append(Finding("audit", "metadata.hidden_text", "ok", title, {"fields": len(strings)}, crit, command))
    return out


def special_id_findings(
    check: str, ids: dict[str, Any], n: int | None, crit: str, command: str, harm: Callable[[dict], str] | None = None
) -> list[Finding]:
    """Special-token ids (name -> an id or a list of ids) against an ``n``-token vocabulary: one outside it is a bug
    (``harm`` says what follows), none declared is not checked."""
    ev = {"ids": ids, "vocabulary": n}
    if n is None or not ids:
        return [Finding("audit", check, "info", "special-token ids not checked: none declared", ev)]
    flat = {k: v for k, vs in ids.items() for v in (vs if isinstance(vs, list) else [vs])}
    bad = {k: v for k, v in flat.items() if not (isinstance(v, numbers.Integral) and 0 <= int(v) < n)}
    if bad:
        names = ", ".join(f"{k} = {v}" for k, v in bad.items())
        why = f" ({harm(bad)})" if harm else ""
        title = f"special-token id(s) outside the {n}-token vocabulary: {names}{why}"
        return [Finding("audit", check, "bug", title, ev, crit, command)]
    return [
        Finding(
            "audit", check, "ok", f"{len(ids)} special-token ids inside the {n}-token vocabulary", ev, crit, command
        )
    ]
