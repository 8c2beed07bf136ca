from django.urls import path

from . import views

urlpatterns = [path("jobs/<int:pk>/report/", views.JobReportView.as_view(), name="job-report")]
