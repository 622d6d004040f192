"""`kubeddp check` on every code block of the DDP tutorials our users learn from
(../shared/tutorials, read at test time; tests/helpers/tutorial_pages.py): the table below is
what each block holds, read by hand, on one node, on two nodes and with `${local_rank}` passed.
Blocks that are not Python (shell lines, fragments cut mid-statement) are refused in one line.

Many blocks are fragments: what they show is judged, and a name they use without importing it
(`mp.spawn` without `import torch.multiprocessing as mp`) is not followed, as in any script.
Where the tutorial gives one script in several blocks, the blocks are checked joined too.
A page that changed fails its pin: read it again and update its rows."""

from __future__ import annotations

import pytest

from kubeddp.trainer.script_check.checks import ScriptCheckError, check_source
from kubeddp.trainer.script_check.source import parse
from tests.helpers import tutorial_pages

MACRO_ARGS = ["--local_rank=${local_rank}"]
SITUATIONS = {"one node": (1, []), "two nodes": (2, []), "macro passed": (1, MACRO_ARGS)}
ALWAYS, TWO_NODES, NO_ARGS = "always", "nodes=2", "no-args"

PAGES = {
    "000": "c89a5497f6cf468eac204ffe4b2d03623827a0b1c447e175bf0806995ba20568",
    "001": "181f057f1b2757fc67b416b1143baa19cc67978d7c21ace494363567199d6e3b",
    "002": "94ede2a1dacdf10027a377d10b0e11d520de4a58406df1676921595067e9b97f",
    "003": "afd3f96eb14500b3fe89014d46592394020e1e4f5a4d026ee4cf56dfda1c0c4c",
    "004": "cf78e4411743d971e6b317995daad8806c94db41d9fe8f05ce570104a9f3cd85",
}
# Shell lines, the `git` tree of a repository, and fragments cut mid-block (001#04 mixes tabs
# and spaces): what `kubeddp check` refuses with one line.
NOT_PYTHON = {
    "000#00", "001#04", "001#05", "001#06", "001#10", "001#13", "001#14", "002#01", "002#03",
    "003#00", "003#04", "003#06", "003#07", "003#08", "003#09", "003#17", "003#18", "003#19",
    "003#20", "003#21", "003#22", "003#23", "003#25", "004#02", "004#03", "004#18", "004#19",
    "004#20", "004#21", "004#27", "004#28",
}  # fmt: skip
# block -> (line in the block, rule, when); a block with no row has no finding.
EXPECTED: dict[str, set[tuple[int, str, str]]] = {
    # torchrun style, LOCAL_RANK from the environment: only the missing timeout
    "000#01": {(8, "init-no-timeout", ALWAYS)},
    # the mp.spawn setup: a loopback master, a fixed port
    "001#01": {(1, "hardcoded-master", TWO_NODES), (2, "fixed-master-port", ALWAYS),
               (4, "init-no-timeout", ALWAYS)},
    "001#03": {(5, "no-set-epoch", ALWAYS)},  # the sampler alone; set_epoch is in 001#04
    # mp.spawn on every GPU of the machine; checkpoint.pt is saved on rank 0 and never loaded
    "001#07": {(78, "init-no-timeout", ALWAYS), (93, "hardcoded-master", TWO_NODES),
               (96, "spawn-several-nodes", TWO_NODES)},
    # torchrun snapshots: snapshot.pt written in place and resumed from
    "001#09": {(51, "load-no-map-location", ALWAYS), (64, "snapshot-in-place", ALWAYS),
               (92, "init-no-timeout", ALWAYS)},
    "001#12": {(52, "load-no-map-location", ALWAYS), (65, "snapshot-in-place", ALWAYS),
               (93, "init-no-timeout", ALWAYS)},
    # the launch era: --local_rank parsed and used as the device; "%d.ckpt" % epoch is written
    # once, at the last epoch, and never loaded (ckpt_path is None): no snapshot pitfall
    "002#00": {(35, "local-rank-arg", NO_ARGS), (40, "init-no-timeout", ALWAYS),
               (55, "load-no-map-location", ALWAYS)},
    # mp.spawn without its import (not followed: the port is only advice)
    "002#02": {(3, "init-no-timeout", ALWAYS), (31, "hardcoded-master", TWO_NODES),
               (32, "fixed-master-port", ALWAYS)},
    "002#04": {(1, "init-no-timeout", ALWAYS), (3, "no-set-epoch", ALWAYS)},
    "003#01": {(2, "hardcoded-master", TWO_NODES), (3, "fixed-master-port", ALWAYS),
               (6, "init-no-timeout", ALWAYS)},
    "003#03": {(2, "no-set-epoch", ALWAYS)},
    # mp.Process workers on 127.0.0.1
    "004#00": {(14, "hardcoded-master", TWO_NODES), (16, "init-no-timeout", ALWAYS),
               (24, "spawn-several-nodes", TWO_NODES)},
    # another host's address for MASTER_ADDR
    "004#04": {(2, "init-no-timeout", ALWAYS), (12, "hardcoded-master", ALWAYS),
               (13, "fixed-master-port", ALWAYS), (19, "init-no-timeout", ALWAYS)},
    "004#05": {(4, "init-no-timeout", ALWAYS), (4, "tcp-init", ALWAYS)},
    "004#06": {(3, "file-init", ALWAYS), (3, "init-no-timeout", ALWAYS)},
    "004#25": {(1, "init-no-timeout", ALWAYS)},
    "004#29": {(4, "init-no-timeout", ALWAYS)},
}  # fmt: skip
# One script the tutorial gives in pieces: torch.distributed.launch's --local-rank recipe.
JOINED: dict[tuple[str, ...], set[tuple[int, str, str]]] = {
    ("004#22", "004#23", "004#24", "004#26"): {(3, "local-rank-arg", NO_ARGS)},
}


def all_blocks() -> dict[str, tutorial_pages.Block]:
    found = {}
    for page, path in tutorial_pages.pages().items():
        assert tutorial_pages.sha256(path) == PAGES.get(page), (
            f"tutorial page {path.name} is not the one this table was read from: read it again "
            "and update the rows of its blocks and its sha256"
        )
        found.update({block.key: block for block in tutorial_pages.blocks(page, path)})
    return found


def wanted(rows: set[tuple[int, str, str]], nodes: int, args: list[str]) -> set[tuple[int, str]]:
    return {
        (line, rule) for line, rule, when in rows
        if not (when == TWO_NODES and nodes < 2) and not (when == NO_ARGS and args)
    }  # fmt: skip


def test_the_table_names_every_block_of_every_page() -> None:
    blocks = all_blocks()
    assert sorted(PAGES) == sorted(tutorial_pages.pages())
    assert set(EXPECTED) | NOT_PYTHON <= set(blocks)
    assert not set(EXPECTED) & NOT_PYTHON
    joined = {key for keys in JOINED for key in keys}
    assert joined <= set(blocks) - NOT_PYTHON


def test_blocks_that_are_not_python_are_refused_in_one_line() -> None:
    blocks = all_blocks()
    for key in sorted(NOT_PYTHON):
        with pytest.raises(ScriptCheckError) as refused:
            parse(blocks[key].code, key)
        assert "\n" not in str(refused.value), key


@pytest.mark.parametrize("situation", SITUATIONS)
def test_check_finds_exactly_what_the_table_says_in_every_block(situation: str) -> None:
    nodes, args = SITUATIONS[situation]
    wrong = {}
    for key, block in all_blocks().items():
        if key in NOT_PYTHON:
            continue
        found = {(f.line, f.rule) for f in check_source(block.code, nodes, args)}
        want = wanted(EXPECTED.get(key, set()), nodes, args)
        if found != want:
            wrong[key] = {"missed": sorted(want - found), "unexpected": sorted(found - want)}
    assert wrong == {}


@pytest.mark.parametrize("situation", SITUATIONS)
@pytest.mark.parametrize("keys", JOINED, ids="+".join)
def test_a_script_given_in_pieces_is_checked_whole(keys: tuple[str, ...], situation: str) -> None:
    nodes, args = SITUATIONS[situation]
    blocks = all_blocks()
    source = "".join(blocks[key].code for key in keys)
    found = {(f.line, f.rule) for f in check_source(source, nodes, args)}
    assert found == wanted(JOINED[keys], nodes, args)
