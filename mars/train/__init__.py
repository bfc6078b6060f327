"""mars.train"""
