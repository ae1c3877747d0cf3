"""Streamlit glue shared by app.py and the pages: sidebar settings, per-tab state, cached resources, views.

Nothing here decodes or measures: it calls engine/ and profiling/ and turns their records into widgets and
figures. The engine never imports this package.
"""
