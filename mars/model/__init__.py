"""mars.model"""
