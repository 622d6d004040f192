"""The Helm chart's Python side: its values (`values`, built from `value_types` and `patterns`),
`kubeddp render`'s options onto those values (`render_options`), rendering with Helm's engine
(`render`), and `make chart`, which writes the chart's generated files (`generate`)."""
