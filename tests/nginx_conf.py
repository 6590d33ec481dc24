"""nginx configurations for the tests that put a real nginx in front: what
every one shares (in the foreground, its pid, error log and temp files in
the test's directory `dir`), around the test's own http block."""


def nginx_conf(dir, http, user=None, connections=1024):
    """The whole nginx.conf: `http` is the inside of the http block (its
    upstreams and servers); user: the workers' user (nginx starts as root)."""
    return f"""{f"user {user};" if user else ""}
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
daemon off;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{http}
}}
"""
