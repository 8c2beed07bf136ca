from django.contrib import admin

from .models import Agent, RegistrationToken

admin.site.register(Agent)
admin.site.register(RegistrationToken)
