from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "kiln.accounts"
    label = "accounts"
