from django.contrib import admin

from .models import Blob, Dataset, Model, ModelVersion

for model in (Blob, Model, ModelVersion, Dataset):
    admin.site.register(model)
