from django.urls import path

from . import views

urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="jobs"),
    path("jobs/<id:pk>/", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<id:pk>/cancel/", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<id:pk>/artifacts/", views.JobArtifactsView.as_view(), name="job-artifacts"),
    path("artifacts/<id:pk>/download/", views.ArtifactDownloadView.as_view(), name="artifact-download"),
]
