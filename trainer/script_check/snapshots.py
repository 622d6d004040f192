"""`snapshot-in-place`: a DDP script that resumes from a snapshot it overwrites in place.

A kill during the save (a preemption whose grace ran out) leaves half a file, and every retry
then fails to load it. The rule needs the file saved to be the file loaded: the same variable
or attribute, the same text, or (where the texts are not both known) both named like a
snapshot. A save to a new name each time (`f"{epoch}.pt"`) overwrites nothing, and a file
saved and never loaded is nobody's resume point: neither is a pitfall.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kubeddp.trainer.script_check.model import (
    ParsedScript,
    dotted,
    last,
    literal_text,
    shown,
    text,
)

RENAMES = ("replace", "rename", "move")  # os.replace, os.rename, Path.replace, shutil.move
SNAPSHOT_WORDS = re.compile(r"snap|ckpt|checkpoint|resume", re.IGNORECASE)


def _value_of(script: ParsedScript, path: ast.expr) -> ast.expr:
    """The expression a path names: itself, or the value last assigned to the name."""
    if isinstance(path, (ast.Name, ast.Attribute)):
        value = script.assigned_value(dotted(path), path)
        if value is not None:
            return value
    return path


def path_text(script: ParsedScript, path: ast.expr) -> str | None:
    """The leading literal text of a path, or of the value assigned to the name that holds it."""
    found = text(path)
    if found is None and isinstance(path, (ast.Name, ast.Attribute)):
        value = script.assigned_value(dotted(path), path)
        found = text(value) if value is not None else None
    return found


def _new_name_each_time(value: ast.expr) -> bool:
    """A path formatted with fields (`f"{epoch}.pt"`, `"%d.ckpt" % epoch`, `"{}".format(e)`):
    each save may write another file."""
    if isinstance(value, ast.JoinedStr):
        return any(isinstance(part, ast.FormattedValue) for part in value.values)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mod):
        return True
    return isinstance(value, ast.Call) and last(value.func) == "format"


def _renamed_after(script: ParsedScript, save: ast.Call) -> bool:
    """Whether the function that saves renames a file after the save (an atomic write)."""
    scope = script.function_of(save) or script.tree
    return any(
        isinstance(node, ast.Call) and last(node.func) in RENAMES and node.lineno >= save.lineno
        for node in ast.walk(scope)
    )


def _same_file(script: ParsedScript, saved: ast.expr, loaded: ast.expr) -> bool:
    names = last(saved), last(loaded)
    if names[0] and names[0] == names[1]:
        return True
    texts = path_text(script, saved) or "", path_text(script, loaded) or ""
    if texts[0] and texts[0] == texts[1]:
        return True
    whole = literal_text(_value_of(script, saved)), literal_text(_value_of(script, loaded))
    if whole[0] is not None and whole[1] is not None:
        return False  # two known names, and they differ
    pairs = zip(names, texts, strict=True)
    return all(SNAPSHOT_WORDS.search(f"{name} {words}") for name, words in pairs)


def snapshot_rule(script: ParsedScript, distributed: bool) -> Iterator[tuple]:
    """A DDP script that loads the file it saves resumes from it: a save in place can be cut."""
    torch_calls = [(script.resolved(c.func), c) for c in script.calls if c.args]
    loaded = [c.args[0] for name, c in torch_calls if name == "torch.load"]
    if not distributed or not loaded:
        return
    for name, call in torch_calls:
        if name != "torch.save" or len(call.args) < 2 or _renamed_after(script, call):
            continue
        saved = call.args[1]
        if _new_name_each_time(_value_of(script, saved)):
            continue
        if any(_same_file(script, saved, other) for other in loaded):
            yield call.lineno, "snapshot-in-place", {"value": shown(saved)}
