"""mkdocs hook: the command-line reference, rendered from the argparse parser itself.

A page containing ``<!-- argparse: module:function -->`` gets, in its place, every subcommand of the parser
that ``function()`` returns: its usage line and, for each of its option groups in ``--help``'s order, a heading
and a table of the group's options (flag, choices, default, help) taken from the parser's own help strings, and
the exit statuses (the epilog), so the page cannot drift from ``dgl-oac train --help``.
"""
from __future__ import annotations

import argparse
import importlib
import re

MARKER = re.compile(r"<!-- argparse: ([\w.]+):(\w+) -->")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _options(parser: argparse.ArgumentParser, actions: list) -> str:
    fmt = parser._get_formatter()
    rows = ["| option | choices | help (default) |", "|---|---|---|"]
    for action in actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.dest}`"
        if action.nargs != 0 and action.option_strings:
            flags += f" `{action.metavar or action.dest.upper()}`"
        choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
        help_text = fmt._expand_help(action) if action.help else ""
        rows.append(f"| {flags} | {choices} | {_cell(help_text)} |")
    return "\n".join(rows)


def _groups(parser: argparse.ArgumentParser) -> list:
    """``--help``'s groups, in its order, as Markdown: a heading and a table each (groups with no option but
    ``--help`` are left out)."""
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if actions:
            out += [f"### {group.title}", "", _options(parser, actions), ""]
    return out


def render(parser: argparse.ArgumentParser) -> str:
    out = []
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for sub in subs:
        helps = {a.dest: a.help for a in sub._choices_actions}  # the one-line help of each subcommand
        for name, child in sub.choices.items():
            usage = child.format_usage().replace("usage: ", "").strip()
            out += [f"## `{parser.prog} {name}`", "", _cell((helps.get(name) or "").capitalize() + "."), "",
                    "```text", usage, "```", ""] + _groups(child)
            if child.epilog:
                out += [_cell(child.epilog[0].upper() + child.epilog[1:]) + ".", ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def repl(match: re.Match) -> str:
        module = importlib.import_module(match.group(1))
        return render(getattr(module, match.group(2))())
    return MARKER.sub(repl, markdown)
