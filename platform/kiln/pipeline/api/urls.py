from django.urls import path

from . import views

urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="jobs"),
    path("jobs/<int:pk>/", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:pk>/cancel/", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:pk>/stream/", views.JobStreamView.as_view(), name="job-stream"),
    path("jobs/<int:pk>/rerun/", views.JobRerunView.as_view(), name="job-rerun"),
    path("jobs/<int:pk>/artifacts/", views.JobArtifactsView.as_view(), name="job-artifacts"),
    path("artifacts/<int:pk>/download/", views.ArtifactDownloadView.as_view(), name="artifact-download"),
]
