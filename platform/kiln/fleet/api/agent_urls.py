from django.urls import path

from . import agent_views as views

urlpatterns = [
    path("register", views.RegisterView.as_view(), name="agent-register"),
    path("heartbeat", views.heartbeat_view, name="agent-heartbeat"),
    path("tasks/lease", views.lease_view, name="agent-lease"),
    path("tasks/<id:task_id>/progress", views.ProgressView.as_view(), name="agent-task-progress"),
    path("tasks/<id:task_id>/artifact", views.ArtifactView.as_view(), name="agent-task-artifact"),
    path("tasks/<id:task_id>/artifact-upload", views.ArtifactUploadView.as_view(), name="agent-task-artifact-upload"),
    path("tasks/<id:task_id>/result", views.ResultView.as_view(), name="agent-task-result"),
    path("tasks/<id:task_id>/files/<str:name>", views.TaskFileView.as_view(), name="agent-task-file"),
    path("uploads", views.AgentUploadListView.as_view(), name="agent-uploads"),
    path("uploads/<uuid:upload_id>", views.AgentUploadDetailView.as_view(), name="agent-upload-detail"),
]
