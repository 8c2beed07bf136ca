"""Per-device reports of a job: every measured variant, the Pareto set and the recommendation."""
from django.db import models

from kiln.accounts.models import Organization
from kiln.pipeline.models import DeploymentJob, DeviceTask


class Report(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="reports")
    job = models.ForeignKey(DeploymentJob, on_delete=models.CASCADE, related_name="reports")
    target = models.CharField(max_length=200)
    agent = models.ForeignKey("fleet.Agent", null=True, on_delete=models.SET_NULL, related_name="+")
    recommended_task = models.ForeignKey(DeviceTask, null=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["job", "target"], name="one_report_per_job_target")]
