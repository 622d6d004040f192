"""`kubeddp completion bash|zsh|fish`: a shell completion script made from the parsers
themselves, so every command and option `--help` lists completes, and nothing else.

    source <(kubeddp completion bash)                                   # ~/.bashrc
    source <(kubeddp completion zsh)                                    # ~/.zshrc
    kubeddp completion fish > ~/.config/fish/completions/kubeddp.fish
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish")


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted({opt for action in parser._actions for opt in action.option_strings})


def commands(root: argparse.ArgumentParser) -> dict[str, list[str]]:
    """command -> its options, from the CLI's parser `root` (train and launch have their own
    parsers). The CLI passes its parser in: this module does not import the CLI."""
    from kubeddp.trainer.launcher.launch import launch_parser, train_parser

    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    found = {name: _options(parser) for name, parser in sub.choices.items()}
    found["train"] = _options(train_parser())  # torchrun's flags from kubeddp's table: no torch
    found["launch"] = _options(launch_parser())
    found["completion"] = ["--help", "-h"]
    return dict(sorted(found.items()))


def _bash(table: dict[str, list[str]]) -> str:
    # COMPREPLY=($(compgen ...)), not mapfile: zsh runs this function too (bashcompinit).
    cases = "\n".join(f'    {name}) opts="{" ".join(opts)}" ;;' for name, opts in table.items())
    return f"""# kubeddp completion for bash (kubeddp completion bash)
_kubeddp() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" opts=""
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{" ".join(table)} --help --version" -- "$cur"))
    return
  fi
  case "${{COMP_WORDS[1]}}" in
{cases}
  esac
  if [ "${{COMP_WORDS[1]}}" = completion ] && [ "$COMP_CWORD" -eq 2 ]; then
    opts="{" ".join(SHELLS)}"
  elif [[ "$cur" != -* ]]; then
    COMPREPLY=($(compgen -f -- "$cur"))
    return
  fi
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}}
complete -o default -F _kubeddp kubeddp
"""


def _zsh(table: dict[str, list[str]]) -> str:
    return (
        "# kubeddp completion for zsh (kubeddp completion zsh): the bash one, via bashcompinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + _bash(table)
    )


def _fish(table: dict[str, list[str]]) -> str:
    lines = [
        "# kubeddp completion for fish (kubeddp completion fish)",
        "complete -c kubeddp -f",
        "complete -c kubeddp -l version -d 'print the version'",
    ]
    names = " ".join(table)
    for name in table:
        lines.append(f"complete -c kubeddp -n 'not __fish_seen_subcommand_from {names}' -a {name}")
    for name, opts in table.items():
        for opt in opts:
            flag = f"-l {opt[2:]}" if opt.startswith("--") else f"-s {opt[1:]}"
            lines.append(f"complete -c kubeddp -n '__fish_seen_subcommand_from {name}' {flag}")
    shells = " ".join(SHELLS)
    lines.append(f"complete -c kubeddp -n '__fish_seen_subcommand_from completion' -a '{shells}'")
    return "\n".join(lines) + "\n"


def script(shell: str, root: argparse.ArgumentParser) -> str:
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](commands(root))
