"""Manifests and the chart: the job kinds, the chart's values, rendering through Helm,
validation against the bundled schemas, and the names every object shares."""
