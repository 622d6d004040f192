"""The kubeddp Helm chart, importable as `kubeddp.chart` so the wheel ships it for `kubeddp
render` (read with importlib.resources). Helm ignores this file (.helmignore)."""
