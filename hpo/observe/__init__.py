"""Reading a study: live progress, status and best views, the report, dashboards and ssh tunnels."""
