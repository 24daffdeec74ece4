"""The figures of every experiment, each saved as PNG beside the CSV of its numbers."""
