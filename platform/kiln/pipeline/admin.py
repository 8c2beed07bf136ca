from django.contrib import admin

from .models import Artifact, DeploymentJob, DeviceTask, JobEvent, Variant

for model in (DeploymentJob, JobEvent, Artifact, Variant, DeviceTask):
    admin.site.register(model)
