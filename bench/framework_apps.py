"""Real-framework apps for bench/run_frameworks.py: a small Flask JSON
service and a one-file Django service (no database)."""
import os

# ---- Flask: one route with a parameter, jsonify, one header read --------------
from flask import Flask, jsonify, request

flask_app = Flask(__name__)


@flask_app.route("/user/<int:uid>")
def user(uid):
    return jsonify(id=uid, name=f"user{uid}", agent=request.headers.get("User-Agent", ""))


# ---- Django: the project template's security, common and clickjacking
# middleware, a view rendering a small template --------------------------------
import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-only-not-secret",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    ],
    TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [],
                "OPTIONS": {"loaders": [("django.template.loaders.locmem.Loader", {
                    "user.html": "<html><body><h1>{{ name }}</h1><p>id {{ id }}</p>"
                                 "<ul>{% for i in items %}<li>{{ i }}</li>{% endfor %}</ul></body></html>"})]}}],
    USE_TZ=True,
)
django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.shortcuts import render  # noqa: E402
from django.urls import path  # noqa: E402


def django_user(req, uid):
    return render(req, "user.html", {"name": f"user{uid}", "id": uid, "items": range(5)})


urlpatterns = [path("user/<int:uid>", django_user)]
django_app = get_wsgi_application()
