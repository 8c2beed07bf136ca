from django.urls import path

from . import views

urlpatterns = [
    path("jobs/<int:pk>/report/", views.JobReportView.as_view(), name="job-report"),
    path("performance/", views.PerformanceListView.as_view(), name="performance"),
    path("performance/estimate/", views.PerformanceEstimateView.as_view(), name="performance-estimate"),
]
