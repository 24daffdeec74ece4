"""The papers' experiments: reproduction targets, studies, figures, claims and the
report."""
