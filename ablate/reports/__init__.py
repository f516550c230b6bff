"""Reports: dashboard specs, panels (data first, then a Plotly figure), and the offline HTML page."""
