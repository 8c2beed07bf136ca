from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "kiln.pipeline"
    label = "pipeline"
